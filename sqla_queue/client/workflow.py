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
after both; ``c.after(a, b)`` too, for any graph (``schema/steps.py``:
a workflow brings the parents of its tasks). ``enqueue`` adds every task
to the session and flushes: the first steps are ordinary ``pendente``
tasks, the others wait (``agendada`` with no time) until the last of their
parents commits its ``sucesso``, in whose transaction the worker releases
them (``batch/workflow.py``).
Nothing commits here: the workflow commits or rolls back with the caller's
transaction, whole.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from sqlalchemy import Connection, inspect
from sqlalchemy.orm import Session

from ..adapters import Adapter, adapter_of
from ..batch.workflow import descendants
from ..common.exceptions import ConfigurationError, InvalidTaskError, TaskNotFoundError
from ..schema.mixins import (
    GATE_FANIN,
    ON_FAILURE,
    STEP_CANCELLED,
    STEP_COMPENSATION,
    QueueMixin,
    Status,
)
from ..schema.rows import CANCELLED_MESSAGE, STEP_MESSAGE, STOPPED_MESSAGE
from ..schema.steps import AFTER, Steps, named

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["Workflow", "cancel_workflow", "chain", "group", "resume_steps"]

Step = Union[QueueMixin, "Workflow"]


class Workflow(Steps):
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

    def enqueue(self, session: Session, *, on_failure: str = "stop", compensate: Any = None) -> int:
        """Add every task of the workflow to ``session`` and flush; the
        workflow's id (its first task's id). Nothing is committed.
        ``on_failure``: what a step that goes to the dead letter does to
        the steps after it, ``stop`` (they are cancelled) or ``continue``
        (they run; its result reads as None). ``compensate``: an unsaved
        task of the same queue that runs if a step goes to the dead letter
        (the steps after it cancelled, as with ``stop``), and is cancelled
        when the workflow succeeds."""
        if compensate is not None:
            if on_failure not in ("stop", "compensate"):
                raise ConfigurationError(
                    f"a compensation step stops the workflow: on_failure {on_failure!r} "
                    "cannot go with compensate"
                )
            on_failure = "compensate"
        elif on_failure == "compensate":
            raise ConfigurationError('on_failure="compensate" needs a compensate= task')
        if on_failure not in ON_FAILURE:
            raise ConfigurationError(
                f"on_failure must be one of {', '.join(ON_FAILURE)}, not {on_failure!r}"
            )
        graph = _Graph.of(self if compensate is None else Workflow("group", [self, compensate]))
        extra = [] if compensate is None else [compensate]
        if compensate is not None and not isinstance(compensate, QueueMixin):
            raise InvalidTaskError(
                f"compensate is one task of the queue model, not {type(compensate).__name__}"
            )
        for task in graph.tasks:
            if task in graph.waiting or task is compensate:
                if task.run_at is not None:
                    raise InvalidTaskError(
                        "a workflow step that waits for others runs when they are done: "
                        f"give it no run_at ({task!r})"
                    )
                task.status = Status.SCHEDULED.value
        for task in graph.tasks:
            if task is not compensate:  # its completion opens a gate: its children's or the end's
                task.message = STEP_MESSAGE
        session.add_all(graph.tasks)
        session.flush()
        mapper = inspect(graph.tasks[0]).mapper
        conn = session.connection(bind_arguments={"mapper": mapper})
        queries = adapter_of(conn.dialect, mapper.local_table).workflow  # type: ignore[arg-type]
        ids = {id(task): int(task.id) for task in graph.tasks}
        waiting = sorted(ids[id(task)] for task in [*graph.waiting, *extra])
        if queries.task_wait_many(conn, ids=waiting) != len(waiting):
            raise InvalidTaskError("a workflow's waiting step was not stored as agendada")
        workflow_id = min(ids.values())
        queries.steps_insert_many(
            conn, rows=[(step, workflow_id, on_failure) for step in sorted(ids.values())]
        )
        if compensate is not None:
            queries.steps_mark(conn, step_ids=[ids[id(compensate)]], state=STEP_COMPENSATION)
        parents: dict[int, list[int]] = {}
        for child, parent, _ in sorted(graph.edges, key=lambda edge: edge[2]):
            parents.setdefault(ids[id(child)], []).append(ids[id(parent)])
        has_children = {parent for each in parents.values() for parent in each}
        ends = [
            ids[id(task)]
            for task in graph.tasks
            if task is not compensate and ids[id(task)] not in has_children
        ]
        parents[-workflow_id] = ends  # the workflow's end waits for the steps without children
        edges, gates = _gated(parents)
        queries.edges_insert_many(conn, rows=edges)
        queries.gates_insert_many(conn, rows=gates)
        return workflow_id

    async def enqueue_async(
        self, session: AsyncSession, *, on_failure: str = "stop", compensate: Any = None
    ) -> int:
        """:meth:`enqueue` on an ``AsyncSession``."""
        return await session.run_sync(_enqueue, self, on_failure, compensate)


def _enqueue(session: Session, workflow: Workflow, on_failure: str, compensate: Any) -> int:
    return workflow.enqueue(session, on_failure=on_failure, compensate=compensate)


def _gated(
    parents: dict[int, list[int]],
) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int]]]:
    """The edges (child, parent, position, slot) and gates (owner, slot,
    waiting) of children with ``parents`` (in their order). A child of up to
    ``GATE_FANIN`` parents has one gate (slot 0) they all count down; one of
    more waits on barriers of about sqrt(n) parents each (slots 1 and up:
    blocks of consecutive parents, which lanes claiming in id order finish
    in different blocks), whose last parent counts slot 0 down."""
    edges: list[tuple[int, int, int, int]] = []
    gates: list[tuple[int, int, int]] = []
    for child, above in parents.items():
        n = len(above)
        if n <= GATE_FANIN:
            edges += [(child, parent, position, 0) for position, parent in enumerate(above)]
            gates.append((child, 0, n))
            continue
        block = math.isqrt(n - 1) + 1
        barriers = -(-n // block)
        edges += [
            (child, parent, position, 1 + position // block)
            for position, parent in enumerate(above)
        ]
        gates.append((child, 0, barriers))
        gates += [(child, 1 + k, min(block, n - k * block)) for k in range(barriers)]
    return edges, gates


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
    """A workflow's tasks, parents first and otherwise in the order given,
    its edges (child, parent, the parent's position among the child's
    parents) and the tasks that wait."""

    tasks: list[Any]
    edges: list[tuple[Any, Any, int]]
    waiting: list[Any]
    #: ids of the tasks in ``tasks``, and of those a chain or group names
    #: (a task has one place in a workflow; after() only refers to it)
    _found: set[int] = field(default_factory=set)
    _placed: set[int] = field(default_factory=set)
    #: the last tasks of each chain and group walked, by id of the object
    _lasts: dict[int, list[Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, workflow: Workflow) -> _Graph:
        graph = cls([], [], [])
        graph._walk(workflow)
        graph._add_after()
        model = type(graph.tasks[0])
        for task in graph.tasks:
            if type(task).__table__ is not model.__table__:
                raise InvalidTaskError("a workflow's tasks must all be of one queue table")
            if inspect(task).key is not None:
                raise InvalidTaskError(f"a workflow's task must be new, not saved: {named(task)}")
        graph._sort()
        children = {id(child) for child, _, _ in graph.edges}
        graph.waiting = [task for task in graph.tasks if id(task) in children]
        return graph

    def _walk(self, step: Step) -> tuple[list[Any], list[Any]]:
        """Add ``step``'s tasks and edges; its first tasks and its last."""
        if isinstance(step, QueueMixin):
            if id(step) in self._placed:
                raise InvalidTaskError(f"a workflow names one task twice: {step!r}")
            self._placed.add(id(step))
            if id(step) not in self._found:  # else it joined as a parent already
                self._found.add(id(step))
                self.tasks.append(step)
            return [step], [step]
        if step.kind == "group":
            firsts: list[Any] = []
            lasts: list[Any] = []
            for inner in step.steps:
                first, last = self._walk(inner)
                firsts += first
                lasts += last
        else:
            firsts, lasts = self._walk(step.steps[0])
            for inner in step.steps[1:]:
                first, last = self._walk(inner)
                self.edges += [
                    (child, parent, position)
                    for child in first
                    for position, parent in enumerate(lasts)
                ]
                lasts = last
        self._lasts[id(step)] = lasts
        return firsts, lasts

    def _add_after(self) -> None:
        """The parents each task was given with after(), and theirs: a
        parent the workflow does not name joins it, and a chain's or
        group's last tasks are the parents. Their positions follow the
        task's chain or group parents, in the order after() was given them."""
        given: list[tuple[Any, Any]] = []
        k = 0
        while k < len(self.tasks):  # grows as parents join
            task = self.tasks[k]
            k += 1
            for parent in task.__dict__.get(AFTER, ()):
                if isinstance(parent, Workflow):
                    lasts = self._lasts.get(id(parent))
                    if lasts is None:
                        _, lasts = self._walk(parent)
                else:
                    if id(parent) not in self._found:
                        self._found.add(id(parent))
                        self.tasks.append(parent)
                    lasts = [parent]
                given += [(task, last) for last in lasts]
        taken = Counter(id(child) for child, _, _ in self.edges)
        pairs = {(id(child), id(parent)) for child, parent, _ in self.edges}
        for child, parent in given:
            if (id(child), id(parent)) in pairs:
                raise InvalidTaskError(
                    "a task waits for one parent twice (after() names it again, or its "
                    f"chain or group does already): {child!r} after {parent!r}"
                )
            pairs.add((id(child), id(parent)))
            self.edges.append((child, parent, taken[id(child)]))
            taken[id(child)] += 1

    def _sort(self) -> None:
        """Parents first, the order given kept otherwise (a workflow of
        chains and groups is in that order already); a cycle is refused."""
        place = {id(task): k for k, task in enumerate(self.tasks)}
        parents: dict[int, list[int]] = {}
        children: dict[int, list[int]] = {}
        for child, parent, _ in self.edges:
            parents.setdefault(place[id(child)], []).append(place[id(parent)])
            children.setdefault(place[id(parent)], []).append(place[id(child)])
        waiting = [len(parents.get(k, ())) for k in range(len(self.tasks))]
        ready = [k for k, count in enumerate(waiting) if not count]
        order: list[int] = []
        while ready:
            k = heapq.heappop(ready)
            order.append(k)
            for child in children.get(k, ()):
                waiting[child] -= 1
                if not waiting[child]:
                    heapq.heappush(ready, child)
        if len(order) < len(self.tasks):
            raise InvalidTaskError(self._cycle(parents, set(range(len(self.tasks))) - set(order)))
        self.tasks = [self.tasks[k] for k in order]

    def _cycle(self, parents: dict[int, list[int]], left: set[int]) -> str:
        """The message that names a cycle among ``left``, the tasks the
        sort could not place (each has a parent among them)."""
        path = [min(left)]
        while True:
            parent = next(p for p in parents[path[-1]] if p in left)
            if parent in path:
                cycle = [*path[path.index(parent) :], parent]
                break
            path.append(parent)
        named = " -> ".join(f"{k + 1} ({self.tasks[k].process!r})" for k in reversed(cycle))
        return (
            f"a workflow's tasks wait for each other in a cycle: {named} (each task by "
            "its place in the workflow, from 1, and its process; after() made the cycle)"
        )


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
    queries.steps_mark(
        conn, step_ids=[step for row, step in rows if row in done], state=STEP_CANCELLED
    )
    queries.finish(conn, workflow_id=workflow_id, outcome="cancelled")
    return cancelled


def resume_steps(conn: Connection, adapter: Adapter, revived: Sequence[tuple[int, int]]) -> None:
    """Chains requeued from the dead letter, as (the step they revive, the
    new chain's first row): where one is a workflow step, the new row opens
    its gates when it succeeds, and the steps its dead letter cancelled
    (``stop``, ``compensate``) wait for it again; its workflow runs on. In
    the requeue's transaction. A compensation step that ran stays run."""
    queries = adapter.workflow
    if not revived or not queries.tables_exist(conn):
        return
    for step, new_id in revived:
        found = queries.step_of(conn, step_id=step)
        if found is None:
            continue
        workflow_id, policy = found
        queries.steps_mark(conn, step_ids=[step], state=None)
        if policy == "continue":
            continue  # its dead letter opened its gates: the new chain opens none
        queries.task_mark_steps(conn, ids=[new_id])
        below = descendants(step, queries.edges_of_workflow(conn, workflow_id=workflow_id))
        again = queries.reinstate(conn, ids=sorted(below), message=STOPPED_MESSAGE)
        queries.steps_mark(conn, step_ids=again, state=None)
        queries.reopen(conn, workflow_id=workflow_id)
