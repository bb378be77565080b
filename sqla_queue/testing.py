"""Helpers for the application's own tests: run its handlers without a worker.

Every helper works inside the test's own transaction, through the Session
it is given, and commits nothing: a test that rolls its transaction back
(the usual pytest fixture, docs/testing.md) leaves no task, no outcome and
no handler's work behind. The tasks run as a worker would run them: the
worker's configuration (class attributes, environment, the
``queue_configuration`` table), each handler in a savepoint, the pub/sub
fan-out, time limits, a failure's retry row or dead-letter run. What is
left out: other processes (no locks, no leases renewed), webhook calls, and
time: a retry due later is not run (give the test's worker
``retry_interval_minutes = 0`` to run retries at once).

    from sqla_queue.testing import run_until_empty, enqueued

    def test_billing(session):
        session.add(Task(process="faturar", payload={"order": 7}))
        session.flush()
        outcome = run_until_empty(Faturar, session)
        assert (outcome.succeeded, outcome.failed, outcome.dead) == (1, 0, 0)
        assert enqueued(session, Task, process="email", payload={"order": 7})

An async worker's handlers (``async def execute``) are run by the async
twins, on the test's ``AsyncSession`` (its transaction, nothing committed):
``await arun_until_empty(Notify, session)``, ``await awork_one(...)``,
``await aenqueued(...)``. Each handler gets an ``AsyncSession`` on the
test's transaction (in the task's savepoint); a time limit cancels it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from .adapters import adapter_of
from .common.exceptions import SqlaQueueError
from .config.settings import Settings
from .policies.hooks import TASK_DEAD, TASK_FAILED, TASK_RETRIED, TASK_SUCCEEDED, Hooks
from .schema.mixins import QueueMixin, Status
from .schema.records import TaskRecord
from .worker.app import QueueApp
from .worker.base import WorkerBase

__all__ = [
    "Outcome",
    "aenqueued",
    "arun_until_empty",
    "awork_one",
    "enqueued",
    "run_until_empty",
    "work_one",
]

#: the most tasks one call runs: a handler that enqueues its own process
#: forever would otherwise never return
MAX_TASKS = 10_000


@dataclass
class Outcome:
    """What a helper ran. ``succeeded``: tasks whose handler returned;
    ``failed``: failed attempts (each retried, sent to the dead letter, or a
    dead-letter run that failed); ``dead``: tasks sent to the dead letter;
    ``dead_runs``: dead-letter runs whose ``execute_dead`` returned."""

    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    dead_runs: int = 0

    def _add(self, task: TaskRecord, event: str | None) -> None:
        if event == TASK_SUCCEEDED:
            if task.dead:
                self.dead_runs += 1
            else:
                self.succeeded += 1
        elif event in (TASK_RETRIED, TASK_DEAD, TASK_FAILED):
            self.failed += 1
            if event == TASK_DEAD:
                self.dead += 1


class _Here:
    """A worker's parts on the test's connection and transaction."""

    def __init__(self, worker_class: type[WorkerBase], session: Session) -> None:
        if not (isinstance(worker_class, type) and issubclass(worker_class, WorkerBase)):
            raise SqlaQueueError(f"give a WorkerBase subclass, not {worker_class!r}")
        if worker_class.is_async() and not _awaited():
            name = worker_class.__name__
            raise SqlaQueueError(
                f"{name}'s handlers are coroutine functions: run them with "
                f"await arun_until_empty({name}, async_session) (or awork_one)"
            )
        self.worker = worker_class()
        self.session = session
        self.conn = session.connection()
        self.app = QueueApp(
            self.worker, connection=self.conn, settings=Settings.from_env(), hooks=Hooks()
        )

    def run(self, tasks: list[TaskRecord], outcome: Outcome) -> None:
        app = self.app
        app.claims.add(task.id for task in tasks)
        handler: Any = self.worker.dispatch
        if type(self.worker).is_async():
            handler = self._run_async
        try:
            events = app.manager.run_here(self.conn, tasks, handler)
        finally:
            app.claims.discard(task.id for task in tasks)
        for task, event in zip(tasks, events, strict=True):
            outcome._add(task, event)
        # the ORM objects the test holds must show what was written
        self.session.expire_all()

    def _run_async(self, task: TaskRecord, session: Session) -> Any:
        """An async handler on an ``AsyncSession`` of its savepoint: its
        coroutine is awaited, from the greenlet of the test's
        ``AsyncSession.run_sync``, by the worker's time limit (timelimit.py)."""
        from .worker.aio import async_view

        return self.worker.dispatch(task, async_view(session))  # type: ignore[arg-type]

    def close(self) -> None:
        self.app.close()


def _awaited() -> bool:
    """Whether this runs in a greenlet an async caller awaits (run_sync)."""
    try:
        from sqlalchemy.util.concurrency import in_greenlet
    except ImportError:  # pragma: no cover - SQLAlchemy without greenlet support
        return False
    return bool(in_greenlet())


def run_until_empty(
    worker_class: type[WorkerBase], session: Session, *, max_tasks: int = MAX_TASKS
) -> Outcome:
    """Run every ready task ``worker_class`` handles (its ``processes``,
    its subscriptions), one after another, in ``session``'s transaction,
    until none is ready, retries due now and dead-letter runs included.
    Tasks added to ``session`` and not yet flushed are flushed first: they
    are the test's, as a worker would see them after its commit."""
    session.flush()
    here = _Here(worker_class, session)
    outcome = Outcome()
    app = here.app
    try:
        for _ in range(max_tasks):
            tasks = app.adapter.task_claim_many(
                here.conn, limit=1, owner=app.worker_id, lease_seconds=app.lease.seconds
            )
            if not tasks:
                if app.adapter.task_promote_due(here.conn):
                    continue  # scheduled tasks (retries) that are due now
                return outcome
            here.run(tasks, outcome)
    finally:
        here.close()
    raise SqlaQueueError(
        f"run_until_empty ran {max_tasks} tasks and more are ready: a handler that "
        "enqueues its own work forever? (pass max_tasks= for a longer run)"
    )


def work_one(worker_class: type[WorkerBase], session: Session, task: Any) -> Outcome:
    """Run one given task (the model object or its id), ready (``pendente``),
    in ``session``'s transaction, as :func:`run_until_empty` runs each."""
    task_id = task if isinstance(task, int) else getattr(task, "id", None)
    if not isinstance(task_id, int):
        raise SqlaQueueError(f"give a task (flushed, with an id) or its id, not {task!r}")
    session.flush()
    here = _Here(worker_class, session)
    outcome = Outcome()
    app = here.app
    try:
        claimed = app.adapter.task_claim_ids(
            here.conn, ids=[task_id], owner=app.worker_id, lease_seconds=app.lease.seconds
        )
        if not claimed:
            row = app.adapter.inspection.task_row(here.conn, task_id=task_id)
            found = None if row is None else row.status
            where = "does not exist" if found is None else f"is {found}, not {Status.PENDING}"
            raise SqlaQueueError(f"task {task_id} {where}: work_one runs a ready task")
        here.run(claimed, outcome)
    finally:
        here.close()
    return outcome


def enqueued(
    session: Session,
    model: type[QueueMixin],
    *,
    process: str | None = None,
    payload: Mapping[str, Any] | None = None,
    status: str | None = Status.PENDING.value,
) -> list[Any]:
    """The model's tasks in ``session``'s view (flushed first), oldest first:
    those of ``process``, whose payload holds every key and value of
    ``payload`` (a subset), with ``status`` (default ``pendente``; None:
    any). ``assert len(enqueued(...)) == 2`` is the usual check."""
    session.flush()
    adapter = adapter_of(session.get_bind(model).dialect, model.__table__)
    found = adapter.inspection.tasks_of_model(session, model, process=process, status=status)
    if payload is None:
        return found
    wanted = dict(payload)
    return [task for task in found if _holds(task.payload, wanted)]


def _holds(value: Any, wanted: Mapping[str, Any]) -> bool:
    return isinstance(value, Mapping) and all(
        key in value and value[key] == expected for key, expected in wanted.items()
    )


async def arun_until_empty(
    worker_class: type[WorkerBase], session: Any, *, max_tasks: int = MAX_TASKS
) -> Outcome:
    """:func:`run_until_empty` on an ``AsyncSession`` (an async worker's
    handlers awaited; a sync worker's called)."""
    return await _run_sync(  # type: ignore[no-any-return]
        session, lambda s: run_until_empty(worker_class, s, max_tasks=max_tasks)
    )


async def awork_one(worker_class: type[WorkerBase], session: Any, task: Any) -> Outcome:
    """:func:`work_one` on an ``AsyncSession``."""
    return await _run_sync(session, lambda s: work_one(worker_class, s, task))  # type: ignore[no-any-return]


async def aenqueued(
    session: Any,
    model: type[QueueMixin],
    *,
    process: str | None = None,
    payload: Mapping[str, Any] | None = None,
    status: str | None = Status.PENDING.value,
) -> list[Any]:
    """:func:`enqueued` on an ``AsyncSession``."""
    return await _run_sync(  # type: ignore[no-any-return]
        session, lambda s: enqueued(s, model, process=process, payload=payload, status=status)
    )


async def _run_sync(session: Any, fn: Any) -> Any:
    run_sync = getattr(session, "run_sync", None)
    if run_sync is None:
        raise SqlaQueueError(f"give an AsyncSession, not {session!r}")
    return await run_sync(fn)
