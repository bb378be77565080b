"""Task semantics: claim, run, complete, fail into a retry or a dead letter.

The manager owns the lifecycle of the seed (see ``docs/lifecycle.md``); it
asks its adapter for every database operation and never writes SQL itself.

A batch (one claim) runs on the **work connection**, one task after
another, and its outcomes commit in **groups** (``batching.py``): the
transaction opens at a handler's first statement, and a group commits once
its oldest outcome has waited the commit budget, when the batch ends, or,
while a handler runs without the database, from the lane's commit watch.
Each handler gets its own ORM Session on that transaction, in a SAVEPOINT
where the transaction holds other tasks' outcomes, so a failing handler's
writes roll back alone, and a handler that never touches the database costs
no round trip at all. A group's ``sucesso`` rows are written by one
statement and commit together with the handlers' work, so a committed
``sucesso`` always means the work committed too. With ``batch_size=1`` this
is the classic one-task-per-transaction mode.

Every write to a claimed task is guarded by the claim (``processando`` for
this worker, see ``leases.py``): a group whose ``sucesso`` update does not
match all its rows lost a task to the rescue, and rolls back whole. A
connection lost while a handler runs ends the batch: the running task's
attempt is consumed (a task that kills its connection every time reaches the
dead letter), the others not committed go back to ``pendente``, on a fresh
connection, and the lane reconnects. Where even that fails (the database is
down), the leases run out and the rescue does the same later.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from ..adapters import Adapter, ErrorKind
from ..common.logs import task_fields
from ..common.redaction import describe_error, fit_message, redact
from ..common.types import utcnow
from ..policies.hooks import (
    BATCH_COMMITTED,
    TASK_DEAD,
    TASK_EVENTS,
    TASK_FAILED,
    TASK_HANDED_BACK,
    TASK_RESCUED,
    TASK_RETRIED,
    TASK_SUCCEEDED,
    BatchEvent,
    Hooks,
    TaskEvent,
)
from ..policies.pipeline import BatchStage, Handler, Middleware, compose
from ..policies.retry import LinearBackoff, RetryPolicy
from ..policies.timelimit import TimeLimitExceeded
from ..schema.mixins import MESSAGE_MAX_LENGTH, TRACEBACK_MAX_LENGTH, Status
from ..schema.records import TaskRecord
from ..schema.rows import (
    EXHAUSTED_SUFFIX,
    NO_RETRY_SUFFIX,
    RESCUED_ERROR,
    RETRY_SUFFIX,
    carried_columns,
    dead_letter_row,
    failure_message,
    retry_row,
)
from .transaction import Group, JoinPolicy, Lane, LaneSession, ThreadGate
from .workflow import StepLinks

if TYPE_CHECKING:
    from ..policies.leases import Claims, LeasePolicy
    from ..policies.limits import LimitedClaims

__all__ = [
    "BatchResult",
    "ClaimLost",
    "ConnectionLost",
    "Handler",
    "TaskManager",
    "carried_columns",
    "dead_letter_row",
]

logger = logging.getLogger("sqla_queue.batch.manager")

#: the default commit budget (``commit_budget_ms``): a finished task's
#: outcome waits at most about this long for its commit
DEFAULT_COMMIT_BUDGET_MS = 10


class ConnectionLost(Exception):
    """The work connection died under a batch; the lane must reconnect."""


class ClaimLost(Exception):
    """A batch's guarded ``sucesso`` update missed rows: another worker
    rescued some of its tasks. The batch rolls back."""


def task_label(task: TaskRecord) -> str:
    """How log lines name an attempt: its id, its chain's first id, its
    attempt number and its process; an attempt of a dead-letter run says so
    (its row is stored as ``sucesso`` or ``falha`` like any other, with
    ``dead`` true: a log line must not read as the task's success)."""
    kind = "dead-letter run task" if task.dead else "task"
    return f"{kind} {task.id} (chain {task.chain_id}, attempt {task.attempt}, {task.process})"


def describe_traceback(exc: BaseException) -> str:
    """The frames of ``exc``'s traceback and its one-line description, with
    no exception text from inside it (a database error's text holds SQL and
    parameters)."""
    frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
    return f"Traceback (most recent call last):\n{frames}{describe_error(exc)}"


def _kept_end(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its end (the frames
    nearest the error, and the error itself)."""
    if len(text) <= limit:
        return text
    return "…" + text[len(text) - limit + 1 :]


@dataclass
class BatchResult:
    succeeded: int = 0
    failed: int = 0
    handed_back: list[int] = field(default_factory=list)
    seconds: float = 0.0


class ClaimSource(Protocol):
    """What claims a batch, in transactions of its own on ``conn``: an
    adapter's claim (:class:`PlainClaims`) or a claim built on adapters'
    (fairness.py)."""

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]: ...

    @property
    def capped(self) -> bool:
        """The calling lane's last claim stopped at a limit with tasks left
        ready: claim again after the batch, as after a full one."""
        ...

    @property
    def retry_in(self) -> float | None:
        """Seconds until a rate limit that cut the calling lane's last claim
        short has a token again; None: none did."""
        ...


class PlainClaims:
    """An adapter's claim, in one transaction."""

    capped = False  # no limit of its own
    retry_in = None

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        with conn.begin():
            return self.adapter.task_claim_many(
                conn, limit=limit, owner=owner, lease_seconds=lease_seconds
            )


class TaskManager:
    def __init__(
        self,
        adapter: Adapter,
        backoff: RetryPolicy | None = None,
        *,
        claims: Claims,
        lease: LeasePolicy,
        stages: Sequence[BatchStage] = (),
        middleware: Sequence[Middleware] = (),
        no_retry: tuple[type[BaseException], ...] = (),
        lease_for: Callable[[TaskRecord], float] | None = None,
        hooks: Hooks | None = None,
        claim_source: ClaimSource | None = None,
        limited: LimitedClaims | None = None,
        commit_budget: float = DEFAULT_COMMIT_BUDGET_MS / 1000,
    ) -> None:
        self.adapter = adapter
        #: exceptions that send a task straight to its dead-letter run
        self.no_retry = no_retry
        #: a task's own lease, where the worker gives tasks different ones
        self.lease_for = lease_for
        #: the batch stages (pipeline.py): the pub/sub fan-out runs claimed
        #: publications instead of the handler, the webhook delivery makes a
        #: batch's calls before its transaction and answers for those copies
        self.stages = tuple(stages)
        #: what runs around every handler (pipeline.py): the time limits
        self.middleware = tuple(middleware)
        #: the observers of outcomes, called after each commit (hooks.py)
        self.hooks = hooks or Hooks()
        #: claims through this instead: an adapter whose claim skips paused
        #: processes (the same table and locks: pause.py), a fair claim
        #: by key (fairness.py), or both
        self.claim_source: ClaimSource = claim_source or PlainClaims(adapter)
        #: the claims of processes with a fleet-wide concurrency limit
        #: (limits.py), made before the others, which leave them out
        self.limited = limited
        self.backoff: RetryPolicy = backoff or LinearBackoff()
        self.claims = claims
        self.owner = claims.owner
        self.lease = lease
        self._joins = JoinPolicy(commit_budget)
        #: workflow steps: their children, results and releases (workflow.py)
        self.steps = StepLinks(adapter)

    @property
    def commit_budget(self) -> float:
        """Seconds a finished task's outcome may wait for its commit (batching.py)."""
        return self._joins.budget

    @commit_budget.setter
    def commit_budget(self, seconds: float) -> None:
        self._joins = JoinPolicy(seconds)

    # ----------------------------------------------------------- claiming
    def claim(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        tasks: list[TaskRecord] = []
        if self.limited is not None:
            tasks = self.limited.claim(
                conn, limit=limit, owner=self.owner, lease_seconds=self.lease.seconds
            )
        if len(tasks) < limit:
            tasks += self.claim_source.claim(
                conn, limit=limit - len(tasks), owner=self.owner, lease_seconds=self.lease.seconds
            )
        self.claims.add(task.id for task in tasks)
        if self.lease_for is not None and tasks:
            self._own_leases(conn, tasks)
        if tasks and self.steps.present is not False:
            self.steps.link(conn, tasks)
        return tasks

    @property
    def claim_retry_in(self) -> float | None:
        """Seconds until a rate limit (a process's: limits.py; a key's:
        fairness.py) that cut the last claim short has a token again;
        None: none did."""
        waits = [self.claim_source.retry_in]
        if self.limited is not None:
            waits.append(self.limited.retry_in)
        found = [wait for wait in waits if wait is not None]
        return min(found) if found else None

    @property
    def claim_capped(self) -> bool:
        """The last claim stopped at a concurrency limit with slots of its
        own (limits.py): claim again after the batch, as after a full one."""
        return (self.limited is not None and self.limited.capped) or self.claim_source.capped

    def _own_leases(self, conn: Connection, tasks: Sequence[TaskRecord]) -> None:
        """Give the tasks whose lease differs from the worker's their own,
        now and at every heartbeat."""
        assert self.lease_for is not None
        by_lease: dict[float, list[int]] = {}
        for task in tasks:
            seconds = self.lease_for(task)
            if seconds != self.lease.seconds:
                by_lease.setdefault(seconds, []).append(task.id)
        for seconds, ids in by_lease.items():
            self.claims.set_lease(ids, seconds)
            with conn.begin():
                self.adapter.task_lease_renew(
                    conn, ids=ids, owner=self.owner, lease_seconds=seconds
                )

    def warm(self, work_conn: Connection) -> None:
        """Run the completion's statements once on a lane's new work
        connection, matching no row, and roll back: their compilation and
        the server session's first look at the table are paid now, while
        the lane is idle, not by the first tasks after an idle spell
        (docs/lifecycle.md, "Warm lanes"). Task ids start at 1."""
        try:
            with work_conn.begin() as transaction:
                for results in ([(0, None)], [(0, None), (-1, None)]):
                    self.adapter.task_complete_many(work_conn, results=results, owner=self.owner)
                self.adapter.task_hand_back_many(work_conn, ids=[0], owner=self.owner)
                transaction.rollback()
        except SQLAlchemyError as exc:  # the first task pays instead
            logger.debug("warm-up: %s", describe_error(exc))

    # ----------------------------------------------------------- running
    def run_batch(
        self,
        claim_conn: Connection,
        work_conn: Connection,
        tasks: Sequence[TaskRecord],
        handler: Handler,
        should_stop: Callable[[], bool] = lambda: False,
        lane: Lane | None = None,
    ) -> BatchResult:
        """Run claimed ``tasks`` one after another on ``work_conn`` and record
        every outcome, committed in groups (batching.py): the outcomes
        waiting are committed once the oldest has waited the commit budget,
        before a handler's first statement, and when the batch ends; while a
        handler runs without the database, ``lane``'s watch commits them.

        When ``should_stop()`` turns true, the tasks not yet started go back
        to ``pendente`` in the next commit. A batch whose webhook calls were
        made (before its transaction: see ``stage``) records every outcome
        instead: a call made is never handed back to be made again."""
        started = time.perf_counter()
        if lane is None:
            lane = Lane(0, ThreadGate(), self.commit_budget)
        ids = [task.id for task in tasks]
        handler = compose(handler, work_conn, self.stages, self.middleware)
        lane.flush = self._flush
        lane.may_join = self._joins.may_join
        with lane.gate:
            lane.start(claim_conn, work_conn, list(tasks), events=self._wants_events())
        left: list[int] = []
        try:
            # every stage prepares, even after one made calls
            if any([stage.prepare(work_conn, tasks) for stage in self.stages]):
                should_stop = _never
                with lane.gate:
                    lane.may_hand_back = False
            self._run_lane(lane, handler, should_stop)
        except ConnectionLost as lost:
            culprit = lost.args[0] if lost.args else None
            with lane.gate:
                self._rollback(lane)
                lane.end()
            # guarded: the outcomes committed already stay as they are
            self._recover_after_lost_connection(work_conn, tasks, culprit, lost.__cause__)
            raise
        except BaseException:
            # what was not committed (a deadlock, a lost connection) is not
            # its tasks' fault: they are ready to run again
            with lane.gate:
                self._rollback(lane)
                lane.end()
            self._hand_back_after_rollback(work_conn, ids)
            raise
        finally:
            with lane.gate:
                left = lane.end()
                # after the commit (or the rollback), never before: another worker
                # must not claim a task whose outcome is not yet committed
                self.claims.discard(ids)
                self._release(claim_conn, [i for i in ids if i in lane.locked])
                lane.locked.clear()
            for stage in self.stages:
                stage.forget(ids)
        assert not left  # every task ran or was handed back
        result = BatchResult(
            succeeded=lane.succeeded,
            failed=lane.failed,
            handed_back=lane.handed_back,
            seconds=time.perf_counter() - started,
        )
        if result.handed_back and self.adapter.supports_notify:
            with claim_conn.begin():
                self.adapter.notify(claim_conn)
        if self.hooks.wanted(BATCH_COMMITTED):
            self.hooks.emit(
                [
                    BatchEvent(
                        BATCH_COMMITTED,
                        tasks=len(tasks),
                        succeeded=result.succeeded,
                        failed=result.failed,
                        handed_back=len(result.handed_back),
                        seconds=result.seconds,
                    )
                ]
            )
        return result

    def _wants_events(self) -> bool:
        return self.hooks.wanted(*TASK_EVENTS)

    def _run_lane(self, lane: Lane, handler: Handler, should_stop: Callable[[], bool]) -> None:
        first = True
        while True:
            with lane.gate:
                task = None
                if lane.waiting:
                    if not first and should_stop():
                        lane.group.hand_back += [t.id for t in lane.waiting]
                        lane.waiting.clear()
                    else:
                        task = lane.waiting.popleft()
                if lane.group and (
                    task is None or task.id in lane.alone or lane.due(time.perf_counter())
                ):
                    self._flush(lane, True)
                if task is None:
                    if lane.waiting:  # a failed commit's tasks, to run again one by one
                        continue
                    return
                lane.begin_task(task)
            first = False
            started = time.perf_counter()
            assert lane.work_conn is not None
            message = self._run_one(lane.work_conn, task, handler, lane=lane)
            ended = time.perf_counter()
            seconds = ended - started
            with lane.gate:
                self._joins.finished(lane, task, ended)
                group = lane.group
                event: str | None
                if isinstance(message, _Failed):
                    group.failed += 1
                    event, text = message.event, message.text
                else:
                    group.done.append((task.id, message))
                    group.succeeded.append((task, seconds))
                    event, text = TASK_SUCCEEDED, message
                observed = lane.wants_events and event is not None
                lane.add_outcome(task, TaskEvent(event, task, text, seconds) if observed else None)  # type: ignore[arg-type]
                if task.id in lane.alone:
                    lane.alone.discard(task.id)
                    self._flush(lane, True)

    def _flush(self, lane: Lane, raising: bool) -> None:
        """Commit the outcomes waiting in ``lane``'s group (the gate held),
        with the tasks it hands back. ``raising`` false (the watch, or a
        handler's first statement): a failure is settled here, not raised."""
        group = lane.take_group()
        if not group:
            return
        conn = lane.work_conn
        assert conn is not None
        # a batch of one whose handler sent nothing may commit its completion
        # alone (not a workflow step's: its children's release commits with it)
        alone = (
            len(group.done) == 1
            and not group.failed
            and not group.hand_back
            and not group.succeeded[0][0]._children
        )
        try:
            if lane.transaction is None:
                lane.transaction = conn.begin()
            completed = self.adapter.task_complete_many(
                conn, results=group.done, owner=self.owner, commits=alone
            )
            if completed != len(group.done):
                logger.warning(
                    "%d of %d finished task(s) are no longer claimed by this worker "
                    "(rescued after its lease or lock was lost): their work rolls back",
                    len(group.done) - completed,
                    len(group.done),
                )
                raise ClaimLost()
            if self.steps.present:
                self.steps.advance(conn, [task for task, _ in group.succeeded])
            self.adapter.task_hand_back_many(conn, ids=group.hand_back, owner=self.owner)
            lane.transaction.commit()
            lane.transaction = None
        except BaseException as exc:
            self._rollback(lane)
            self._settle(lane, group, exc, raising)
            return
        self._committed(lane, group)

    def _committed(self, lane: Lane, group: Group) -> None:
        """After a group's commit: its locks go, its successes are logged,
        its observers told."""
        if self.steps.present:
            self.steps.committed(lane.work_conn, self.hooks)
        ids = [task.id for task in group.tasks] + group.hand_back
        self.claims.discard(ids)
        assert lane.claim_conn is not None
        self._release(lane.claim_conn, ids)
        lane.locked.difference_update(ids)
        lane.succeeded += len(group.done)
        lane.failed += group.failed
        lane.handed_back += group.hand_back
        if logger.isEnabledFor(logging.INFO):
            for task, seconds in group.succeeded:
                logger.info(
                    "%s %s in %.1f ms",
                    task_label(task),
                    # a dead-letter run's handler returned: the task itself did not succeed
                    "done" if task.dead else "succeeded",
                    seconds * 1000,
                    extra=task_fields(task, seconds),
                )
        if group.events is not None:
            handed_back = set(group.hand_back)
            events = group.events + [
                TaskEvent(TASK_HANDED_BACK, t) for t in lane.batch if t.id in handed_back
            ]
            if events:
                self.hooks.emit(events)

    def _settle(self, lane: Lane, group: Group, exc: BaseException, raising: bool) -> None:
        """A group whose commit failed (rolled back already)."""
        conn = lane.work_conn
        assert conn is not None
        ids = [task.id for task in group.tasks]
        if isinstance(exc, DBAPIError) and not self._retryable(exc) and len(ids) == 1:
            # one task's work failed at its commit (a deferred constraint):
            # the attempt fails as if its handler had raised
            [task] = group.tasks
            message = describe_error(exc)
            with conn.begin():
                recorded = self.record_failure(conn, task, message)
                self.adapter.task_hand_back_many(conn, ids=group.hand_back, owner=self.owner)
            self._committed(lane, Group(tasks=[task], failed=1, hand_back=group.hand_back))
            if recorded:
                self.hooks.emit([TaskEvent(recorded, task, message)])
                logger.warning(
                    "%s failed at commit: %s",
                    task_label(task),
                    fit_message(message, MESSAGE_MAX_LENGTH),
                    extra=task_fields(task),
                )
            return
        rerun = (isinstance(exc, ClaimLost) and not lane.may_hand_back) or (
            isinstance(exc, DBAPIError) and not self._retryable(exc)
        )
        if rerun and len(ids) > 1:
            # each again in a transaction of its own: the one whose commit
            # fails again is at fault; a call made is answered, not made again
            lane.waiting.extendleft(reversed(group.tasks))
            lane.alone.update(ids)
            back = group.hand_back
        else:
            back = ids + group.hand_back
        # the tasks still ours run again (nothing of the group committed)
        self._hand_back_after_rollback(conn, back)
        self.claims.discard(back)
        lane.handed_back += back
        if raising and not isinstance(exc, ClaimLost) and not rerun:
            raise exc
        if not isinstance(exc, (ClaimLost, DBAPIError)):
            logger.warning(
                "lane %d: committing %d outcome(s) failed: %s",
                lane.index,
                len(ids),
                describe_error(exc),
            )

    def hand_back_waiting(self, lane: Lane) -> None:
        """The watch, while ``lane``'s handler runs past the budget: the
        lane's claimed tasks not started yet go back to ``pendente`` for
        other lanes and workers (the gate held)."""
        waiting = list(lane.waiting)
        conn = lane.claim_conn
        if not waiting or conn is None:
            return
        ids = [task.id for task in waiting]
        lane.waiting.clear()
        try:
            with conn.begin():
                back = self.adapter.task_hand_back_many(conn, ids=ids, owner=self.owner)
                if self.adapter.supports_notify:
                    self.adapter.notify(conn)
        except Exception as exc:  # the lane runs them itself
            lane.waiting.extend(waiting)
            logger.warning("could not hand back waiting tasks: %s", describe_error(exc))
            return
        self.claims.discard(ids)
        self._release(conn, ids)
        lane.locked.difference_update(ids)
        lane.handed_back += ids
        logger.debug(
            "lane %d: %d waiting task(s) handed back while %s runs",
            lane.index,
            back,
            task_label(lane.running) if lane.running is not None else "a task",
        )
        if lane.wants_events:
            self.hooks.emit([TaskEvent(TASK_HANDED_BACK, task) for task in waiting])
        lane.on_hand_back(len(ids))

    @staticmethod
    def _rollback(lane: Lane) -> None:
        transaction, lane.transaction = lane.transaction, None
        if transaction is not None:
            try:
                transaction.rollback()
            except Exception as exc:  # its connection is gone, and the transaction with it
                logger.debug("rolling back a lane's batch: %s", describe_error(exc))
        StepLinks.rolled_back(lane.work_conn)

    def run_here(
        self, conn: Connection, tasks: Sequence[TaskRecord], handler: Handler
    ) -> list[str | None]:
        """Run claimed ``tasks`` in the caller's open transaction on ``conn``
        (``sqla_queue.testing``): each in a savepoint, through the stages and
        middleware, every outcome recorded (``sucesso``, a failure with its
        retry or dead-letter run), nothing committed. No stage's work outside
        a transaction is done (no webhook call). The hooks' event of each
        task's outcome, in order (None: a failure not recorded)."""
        handler = compose(handler, conn, self.stages, self.middleware)
        self.steps.link(conn, tasks)
        outcomes: list[str | None] = []
        done: list[tuple[int, str | None]] = []
        succeeded: list[TaskRecord] = []
        for task in tasks:
            started = time.perf_counter()
            message = self._run_one(conn, task, handler)
            if isinstance(message, _Failed):
                outcomes.append(message.event)
            else:
                done.append((task.id, message))
                succeeded.append(task)
                outcomes.append(TASK_SUCCEEDED)
                logger.info(
                    "%s returned in %.1f ms (in the caller's transaction, not committed)",
                    task_label(task),
                    (time.perf_counter() - started) * 1000,
                    extra=task_fields(task),
                )
        self.adapter.task_complete_many(conn, results=done, owner=self.owner)
        if self.steps.present:
            self.steps.advance(conn, succeeded)
        StepLinks.rolled_back(conn)  # the caller's transaction: nothing is told of it
        return outcomes

    def _retryable(self, exc: DBAPIError) -> bool:
        """A failure that is nobody's task's fault: the connection is gone,
        or the database asks for the transaction to be tried again."""
        return bool(exc.connection_invalidated) or (
            self.adapter.classify(exc) is ErrorKind.TRANSIENT
        )

    def _run_one(
        self, conn: Connection, task: TaskRecord, handler: Handler, *, lane: Lane | None = None
    ) -> Any:
        started = time.perf_counter()
        session = (
            Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
            if lane is None
            else LaneSession(lane)
        )
        if self.steps.present:
            self.steps.prepare(task, session)
        try:
            returned = handler(task, session)
            if task._children:  # a workflow step's result, for its children
                self.steps.keep_result(task, returned)
            if _touched(session):
                session.commit()  # flush, then RELEASE the savepoint
        except Exception as exc:
            if _connection_lost(conn, exc):
                _close_quietly(session)
                raise ConnectionLost(task) from exc
            try:
                session.rollback()
            except SQLAlchemyError as rollback_error:
                if _connection_lost(conn, rollback_error):
                    _close_quietly(session)
                    raise ConnectionLost(task) from exc
                raise
            error = describe_error(exc)
            retry = not isinstance(exc, self.no_retry)
            frames = redact(describe_traceback(exc))
            if lane is not None:
                lane.join(flush_others=False)  # the failure's rows, in the batch's transaction
            recorded = self.record_failure(
                conn, task, error, retry=retry, trace=_kept_end(frames, TRACEBACK_MAX_LENGTH)
            )
            if recorded:
                logger.warning(
                    "%s failed: %s%s",
                    task_label(task),
                    fit_message(error, MESSAGE_MAX_LENGTH),
                    # an expected failure (a webhook's answer) needs no frames
                    "\n" + frames if getattr(exc, "log_traceback", True) else "",
                    extra=task_fields(task, time.perf_counter() - started),
                )
            return _Failed(recorded, error)
        finally:
            if _touched(session) or session.identity_map:
                session.close()
            if self.steps.present:
                self.steps.forget(task)
        return None if returned is None else fit_message(str(returned), MESSAGE_MAX_LENGTH)

    def _hand_back_after_rollback(self, conn: Connection, ids: list[int]) -> None:
        """Hand back this worker's claimed ``ids`` on a fresh connection (the
        batch's may be dead); guarded, so tasks that did commit stay as they are."""
        try:
            with conn.engine.connect() as fresh, fresh.begin():
                self.adapter.task_hand_back_many(fresh, ids=ids, owner=self.owner)
        except Exception as exc:  # their leases run out; the rescue retries them
            logger.warning("could not hand back tasks %s: %s", ids, describe_error(exc))

    def _recover_after_lost_connection(
        self,
        conn: Connection,
        tasks: Sequence[TaskRecord],
        culprit: TaskRecord | None,
        cause: BaseException | None,
    ) -> None:
        """The batch died with its connection: the running task's attempt is
        consumed (a failure and its retry or dead letter), the others go back
        to ``pendente``. All guarded by the claim, on a fresh connection."""
        error = "connection to the database lost while the task ran"
        if isinstance(cause, TimeLimitExceeded):  # abandoned with its connection
            error = describe_error(cause)
        elif cause is not None:
            error = f"{error}: {describe_error(cause)}"
        others = [task.id for task in tasks if task is not culprit]
        recorded = None
        try:
            with conn.engine.connect() as fresh:
                try:
                    with fresh.begin():
                        if culprit is not None:
                            recorded = self.record_failure(fresh, culprit, error)
                        self.adapter.task_hand_back_many(fresh, ids=others, owner=self.owner)
                except BaseException:
                    StepLinks.rolled_back(fresh)
                    raise
                self.steps.committed(fresh, self.hooks)
        except Exception as exc:  # the database is away: the leases run out instead
            logger.warning(
                "could not record the lost batch (%s); the rescue will", describe_error(exc)
            )
            return
        if culprit is not None:
            logger.warning(
                "%s failed: %s",
                task_label(culprit),
                fit_message(error, 500),
                extra=task_fields(culprit),
            )
            if recorded:
                self.hooks.emit([TaskEvent(recorded, culprit, error)])

    def _release(self, claim_conn: Connection, ids: list[int]) -> None:
        if not ids or not self.adapter.task_locks:
            return
        try:
            with claim_conn.begin():
                self.adapter.lock_release_many(claim_conn, ids=ids)
        except Exception as exc:  # the connection is gone, and its locks with it
            logger.warning("could not release task locks: %s", describe_error(exc))
            claim_conn.invalidate()

    # ----------------------------------------------------------- failures
    def record_failure(
        self,
        conn: Connection,
        task: TaskRecord,
        error: str,
        *,
        rescued: bool = False,
        retry: bool = True,
        trace: str | None = None,
    ) -> str | None:
        """Mark the attempt failed and enqueue what follows it: the next
        attempt, or, past the maximum (or with ``retry`` false: an error
        not worth retrying), a dead-letter run. Guarded by the claim (this
        worker's, or for the rescue the lease it found expired): None, and
        nothing written, when the task is no longer that claim's; else the
        hooks' event of what was written (``task_retried``, ``task_dead``,
        ``task_failed`` for a dead-letter run that failed). ``trace``:
        the failed attempt's ``error_traceback``."""
        now = utcnow()
        failed_status = (Status.FAILED_PROCESSING if rescued else Status.FAILED).value
        next_at = self.backoff.next_attempt_at(task.attempt, now) if retry else None
        if next_at is not None:
            message = failure_message(error, RETRY_SUFFIX)
            values = {
                "status": failed_status,
                "reenfileirado": True,
                "mensagem": message,
                "proxima_tentativa": next_at,
                "finished_at": self.adapter.clock(),
                "error_traceback": trace,
            }
            if not self._update_claimed(conn, task, values, rescued=rescued):
                return None
            self.adapter.task_insert_many(
                conn, rows=[retry_row(task, next_at, failed_status, message, now)]
            )
            return TASK_RETRIED
        suffix = EXHAUSTED_SUFFIX if retry else NO_RETRY_SUFFIX
        message = failure_message(error, suffix)
        values = {
            "status": failed_status,
            "estouro_tentativas": True,
            "mensagem": message,
            "finished_at": self.adapter.clock(),
            "error_traceback": trace,
        }
        if not self._update_claimed(conn, task, values, rescued=rescued):
            return None
        if task.dead:
            # the reference starts another dead run here, forever; we stop
            logger.error(
                "%s exhausted its attempts; it stays %s",
                task_label(task),
                # the state's English word, not the stored status
                "rescued (its worker died)" if rescued else "failed",
                extra=task_fields(task),
            )
            return TASK_FAILED
        self.adapter.task_insert_many(conn, rows=[dead_letter_row(task)])
        logger.warning(
            "%s exhausted its attempts: dead-letter run enqueued",
            task_label(task),
            extra=task_fields(task),
        )
        if self.steps.present is not False:
            self.steps.failed(conn, task)  # its workflow's policy, in this transaction
        return TASK_DEAD

    def _update_claimed(
        self, conn: Connection, task: TaskRecord, values: dict[str, Any], *, rescued: bool
    ) -> bool:
        if rescued:
            # the claim the rescue judged lost, unchanged since it looked
            return self.adapter.task_update_claimed(
                conn,
                task_id=task.id,
                values=values,
                owner=task.worker_id,
                lease_expires_at=task.lease_expires_at,
            )
        return self.adapter.task_update_claimed(
            conn, task_id=task.id, values=values, owner=self.owner
        )

    # ----------------------------------------------------------- rescue
    def rescue(self, conn: Connection, *, limit: int = 100) -> int:
        """Re-enqueue tasks whose claim is lost (lease expired, or the
        worker's per-task lock died): ``falha_processando`` + a retry, as
        the seed's retry thread does. One transaction; the rows are locked
        (or, without row locks, updated only if their lease is unchanged),
        so two rescuers, or a rescuer and a late heartbeat, never both win."""
        try:
            with conn.begin():
                lost = self.adapter.task_rescue_lost(conn, limit=limit)
                rescued = [
                    task
                    for task in lost
                    if self.record_failure(conn, task, RESCUED_ERROR, rescued=True)
                ]
        except BaseException:
            StepLinks.rolled_back(conn)
            raise
        self.steps.committed(conn, self.hooks)
        if rescued:
            logger.warning(
                "rescued %d task(s) whose worker lost its claim: %s",
                len(rescued),
                ", ".join(task_label(task) for task in rescued),
            )
            self.hooks.emit([TaskEvent(TASK_RESCUED, task, RESCUED_ERROR) for task in rescued])
            self._end_sessions_of(conn, {task.worker_id for task in rescued})
        return len(rescued)

    def _end_sessions_of(self, conn: Connection, owners: set[str | None]) -> None:
        """Fence the workers whose claims were just rescued: end their lanes'
        sessions where the database cannot find a silent peer itself
        (``Adapter.end_sessions``), so that the rows their open transactions
        wrote (an idempotency key) do not hold up the tasks' next attempts
        (docs/lifecycle.md#network-partitions). Never this worker's own."""
        others = sorted(owner for owner in owners if owner and owner != self.owner)
        if not others:
            return
        try:
            with conn.begin():
                ended = self.adapter.end_sessions(conn, owners=others)
        except Exception as exc:  # their sessions end with the server's timeouts instead
            logger.warning("could not end the sessions of %s: %s", others, describe_error(exc))
            return
        if ended:
            logger.warning(
                "ended %d session(s) of worker(s) %s, whose claims were lost",
                ended,
                ", ".join(others),
            )


@dataclass(frozen=True)
class _Failed:
    """What ``_run_one`` returns for a failed task: the event of what its
    failure wrote (hooks.py) and its message."""

    event: str | None  # None: not recorded (the claim was lost meanwhile)
    text: str


def _never() -> bool:
    return False


def _connection_lost(conn: Connection, exc: BaseException) -> bool:
    """Whether ``exc`` left ``conn`` unusable: invalidated by SQLAlchemy (a
    disconnect), or a driver error that says the connection is gone."""
    if conn.invalidated or conn.closed:
        return True
    if isinstance(exc, DBAPIError):
        return bool(exc.connection_invalidated)
    return False


def _close_quietly(session: Session) -> None:
    try:
        session.close()
    except Exception as exc:  # its connection is dead already
        logger.debug("closing a session on a lost connection: %s", describe_error(exc))


def _touched(session: Session) -> bool:
    """Whether a handler used its Session (an untouched one costs nothing)."""
    return bool(session.in_transaction() or session.new or session.dirty or session.deleted)
