"""Workflows: tasks that wait for other tasks (docs/workflows.md).

::

    from sqla_queue import chain, group

    flow = chain(
        Task(process="fetch", payload={"order": 7}),
        group(Task(process="bill", payload={}), Task(process="ship", payload={})),
        Task(process="notify", payload={}),
    )
    workflow_id = flow.enqueue(session)       # in the caller's transaction

A step is an unsaved task of the application's queue model, a ``chain``
or a ``group``; they nest freely. ``chain(a, b)`` runs ``b`` after ``a``;
``group(a, b)`` runs them side by side; ``group(a, b).then(c)`` runs ``c``
after both. ``enqueue`` adds every task to the session and flushes: the
first steps are ordinary ``pendente`` tasks, the others wait (``agendada``
with no time) until the last of their parents commits its ``sucesso``,
in whose transaction the worker releases them (``batch/workflow.py``).
Nothing commits here: the workflow commits or rolls back with the caller's
transaction, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from sqlalchemy import Connection, inspect
from sqlalchemy.orm import Session

from ..adapters import Adapter, adapter_of
from ..common.exceptions import ConfigurationError, InvalidTaskError, TaskNotFoundError
from ..schema.mixins import ON_FAILURE, QueueMixin, Status
from ..schema.rows import CANCELLED_MESSAGE, STEP_MESSAGE

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["Workflow", "cancel_workflow", "chain", "group"]

Step = Union[QueueMixin, "Workflow"]


class Workflow:
    """Steps run in order (a chain) or side by side (a group)."""

    def __init__(self, kind: str, steps: Sequence[Step]) -> None:
        if not steps:
            raise InvalidTaskError(f"{kind}() needs at least one step")
        for step in steps:
            if not isinstance(step, (QueueMixin, Workflow)):
                raise InvalidTaskError(
                    f"a {kind}'s step is a task of a queue model, a chain or a group, "
                    f"not {type(step).__name__}"
                )
        self.kind = kind
        self.steps = tuple(steps)

    def then(self, step: Step) -> Workflow:
        """This, then ``step`` once all of this has succeeded."""
        return Workflow("chain", [self, step])

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(map(repr, self.steps))})"

    def enqueue(self, session: Session, *, on_failure: str = "stop") -> int:
        """Add every task of the workflow to ``session`` and flush; the
        workflow's id (its first task's id). Nothing is committed.
        ``on_failure``: what a step that goes to the dead letter does to
        the steps after it, ``stop`` (they are cancelled) or ``continue``
        (they run; its result reads as None)."""
        if on_failure not in ON_FAILURE:
            raise ConfigurationError(
                f"on_failure must be one of {', '.join(ON_FAILURE)}, not {on_failure!r}"
            )
        graph = _Graph.of(self)
        for task in graph.tasks:
            if task in graph.waiting:
                if task.run_at is not None:
                    raise InvalidTaskError(
                        "a workflow step that waits for others runs when they are done: "
                        f"give it no run_at ({task!r})"
                    )
                task.status = Status.SCHEDULED.value
        parents = {id(parent) for _, parent, _ in graph.edges}
        for task in graph.tasks:
            if id(task) in parents:  # the claim reads the children of these only
                task.message = STEP_MESSAGE
        session.add_all(graph.tasks)
        session.flush()
        mapper = inspect(graph.tasks[0]).mapper
        conn = session.connection(bind_arguments={"mapper": mapper})
        queries = adapter_of(conn.dialect, mapper.local_table).workflow  # type: ignore[arg-type]
        ids = {id(task): int(task.id) for task in graph.tasks}
        waiting = sorted(ids[id(task)] for task in graph.waiting)
        if queries.task_wait_many(conn, ids=waiting) != len(waiting):
            raise InvalidTaskError("a workflow's waiting step was not stored as agendada")
        workflow_id = min(ids.values())
        queries.steps_insert_many(
            conn, rows=[(step, workflow_id, on_failure) for step in sorted(ids.values())]
        )
        queries.edges_insert_many(
            conn,
            rows=[
                (ids[id(child)], ids[id(parent)], position)
                for child, parent, position in graph.edges
            ],
        )
        return workflow_id

    async def enqueue_async(self, session: AsyncSession, *, on_failure: str = "stop") -> int:
        """:meth:`enqueue` on an ``AsyncSession``."""
        return await session.run_sync(_enqueue, self, on_failure)


def _enqueue(session: Session, workflow: Workflow, on_failure: str) -> int:
    return workflow.enqueue(session, on_failure=on_failure)


def chain(*steps: Step) -> Workflow:
    """``steps`` one after another: each starts once the one before it
    (all of it, for a group) has succeeded, and reads its results."""
    return Workflow("chain", steps)


def group(*steps: Step) -> Workflow:
    """``steps`` side by side; ``.then(callback)`` runs after all of them,
    and reads their results in this order."""
    return Workflow("group", steps)


@dataclass
class _Graph:
    """A workflow's tasks in the order given, its edges (child, parent, the
    parent's position among the child's parents) and the tasks that wait."""

    tasks: list[Any]
    edges: list[tuple[Any, Any, int]]
    waiting: list[Any]

    @classmethod
    def of(cls, workflow: Workflow) -> _Graph:
        graph = cls([], [], [])
        graph._walk(workflow)
        seen: set[int] = set()
        model = type(graph.tasks[0])
        for task in graph.tasks:
            if id(task) in seen:
                raise InvalidTaskError(f"a workflow names one task twice: {task!r}")
            seen.add(id(task))
            if type(task).__table__ is not model.__table__:
                raise InvalidTaskError("a workflow's tasks must all be of one queue table")
            if inspect(task).key is not None:
                raise InvalidTaskError(f"a workflow's task must be new, not saved: {task!r}")
        children = {id(child) for child, _, _ in graph.edges}
        graph.waiting = [task for task in graph.tasks if id(task) in children]
        return graph

    def _walk(self, step: Step) -> tuple[list[Any], list[Any]]:
        """Add ``step``'s tasks and edges; its first tasks and its last."""
        if isinstance(step, QueueMixin):
            self.tasks.append(step)
            return [step], [step]
        if step.kind == "group":
            firsts: list[Any] = []
            lasts: list[Any] = []
            for inner in step.steps:
                first, last = self._walk(inner)
                firsts += first
                lasts += last
            return firsts, lasts
        firsts, lasts = self._walk(step.steps[0])
        for inner in step.steps[1:]:
            first, last = self._walk(inner)
            self.edges += [
                (child, parent, position)
                for child in first
                for position, parent in enumerate(lasts)
            ]
            lasts = last
        return firsts, lasts


def cancel_workflow(conn: Connection, adapter: Adapter, workflow_id: int) -> list[int]:
    """Cancel workflow ``workflow_id``'s steps that wait (for their parents,
    or ``pendente``, or a retry's ``agendada``), as ``cancel`` cancels a
    task; the task rows cancelled. A running step finishes; its children,
    cancelled, are not released. In the caller's transaction."""
    queries = adapter.workflow
    if not queries.steps_of_workflow(conn, workflow_id=workflow_id):
        raise TaskNotFoundError(f"no workflow {workflow_id} in {adapter.table.name}")
    rows = queries.open_of_workflow(conn, workflow_id=workflow_id)
    cancelled = queries.cancel_open(conn, ids=[row for row, _ in rows], message=CANCELLED_MESSAGE)
    done = set(cancelled)
    queries.steps_cancelled(conn, step_ids=[step for row, step in rows if row in done])
    return cancelled
