"""A lane's open batch: the outcomes that wait for their commit, and who may
touch the lane's connections.

A lane runs the tasks of a claim one after another on its work connection,
and commits their outcomes in groups (``TaskManager.run_batch``). Two rules
keep one task from holding another (docs/lifecycle.md#the-batch-transaction):

- **The transaction opens at the first statement**, not before the first
  handler: a handler that has not touched the database holds nothing (on
  SQLite: not the write lock), so its batch-mates' outcomes can be committed
  while it runs, by the lane's :class:`CommitWatch` (worker/commitwatch.py).
- **A handler that may run long after its first statement never joins a
  transaction that holds another task's finished outcome**: at its first
  statement (:class:`LaneSession`'s ``get_bind``) the outcomes waiting are
  committed first, unless :class:`JoinPolicy` finds the join safe: the
  outcomes are young, the handler was quick to reach the database, and no
  handler of its process has lately run long after its first statement.
  Quick handlers that write therefore still share one commit.

Between tasks, the outcomes waiting are committed once the oldest has waited
the commit budget (``commit_budget_ms``); fast tasks therefore still share
one commit. While a handler runs past the budget, the tasks of its claim
not yet started are handed back for other lanes and workers to take.

The lane's thread (or greenlet) and the watch take turns through a
:class:`Gate`: whoever holds it may use the lane's connections.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection
from sqlalchemy.exc import ResourceClosedError
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only

if TYPE_CHECKING:
    from sqlalchemy.engine import RootTransaction

    from ..policies.hooks import TaskEvent
    from ..schema.records import TaskRecord

__all__ = ["Gate", "Group", "JoinPolicy", "Lane", "LaneSession", "LoopGate", "ThreadGate"]


class Gate(Protocol):
    """Mutual exclusion between a lane and its watch."""

    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...

    def try_enter(self) -> bool:
        """Enter only if nobody holds the gate; whether it was entered."""
        ...


class ThreadGate:
    """The gate of a lane that is a thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def try_enter(self) -> bool:
        return self._lock.acquire(blocking=False)


class LoopGate:
    """The gate of a coroutine lane: every holder runs on one event loop, in
    a greenlet (``greenlet_spawn``), and waits for the gate by awaiting."""

    def __init__(self) -> None:
        self._held = False
        self._waiters: list[asyncio.Future[None]] = []

    def __enter__(self) -> None:
        while self._held:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await_only(waiter)
        self._held = True

    def __exit__(self, *exc: object) -> None:
        self._held = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each looks again; the first one in wins
            if not waiter.done():
                waiter.set_result(None)

    def try_enter(self) -> bool:
        if self._held:
            return False
        self._held = True
        return True


@dataclass
class Group:
    """The outcomes of one transaction of a lane, taken for its commit."""

    #: the tasks whose outcome the transaction holds, in the order they ran
    tasks: list[TaskRecord] = field(default_factory=list)
    #: (id, message) of the tasks that succeeded
    done: list[tuple[int, str | None]] = field(default_factory=list)
    #: how many of ``tasks`` failed (their failure is written already)
    failed: int = 0
    #: the hooks' events of the outcomes (None: nobody observes them)
    events: list[TaskEvent] | None = None
    #: (task, seconds its handler ran) of the successes, logged after the commit
    succeeded: list[tuple[TaskRecord, float]] = field(default_factory=list)
    #: claimed tasks that never ran, back to ``pendente`` in the same commit
    hand_back: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tasks or self.hand_back)


class Lane:
    """The state of one lane's batch that its watch reads: what runs, what
    waits to start, what waits for its commit. Read and changed only
    through the gate."""

    def __init__(
        self, index: int, gate: Gate, budget_seconds: float, *, events: bool = False
    ) -> None:
        self.index = index
        self.gate = gate
        #: the longest a finished task's outcome waits for its commit
        self.budget = budget_seconds
        #: whether the outcomes' events are built (someone observes them)
        self.wants_events = events
        self.claim_conn: Connection | None = None
        self.work_conn: Connection | None = None
        #: the batch's open transaction on the work connection, if begun
        self.transaction: RootTransaction | None = None
        #: the batch's tasks, as claimed
        self.batch: list[TaskRecord] = []
        #: claimed tasks not started yet
        self.waiting: deque[TaskRecord] = deque()
        #: ids whose per-task lock is not released yet
        self.locked: set[int] = set()
        #: tasks to run each in a transaction of its own (a group that failed
        #: at its commit: the one at fault is found)
        self.alone: set[int] = set()
        #: whether the waiting tasks may be handed back (not once a stage
        #: made their calls: a webhook call made is never made again)
        self.may_hand_back = True
        self.running: TaskRecord | None = None
        self.running_since = 0.0
        #: the running handler has sent a statement: the work connection is its
        self.joined = False
        #: perf_counter() of the running handler's first statement
        self.joined_at = 0.0
        #: whether a handler may join outcomes of others (TaskManager's policy)
        self.may_join: Callable[[Lane, float], bool] = _never_join
        #: perf_counter() when the oldest outcome not yet committed was ready
        self.oldest: float | None = None
        self.group = Group()
        #: tasks handed back by the watch (the lane reports them)
        self.handed_back: list[int] = []
        #: committed outcomes since the batch began
        self.succeeded = 0
        self.failed = 0
        #: commits the outcomes waiting (TaskManager), under the gate;
        #: ``raising`` false: a failure is settled, not raised
        self.flush: Callable[[Lane, bool], None] = _no_flush
        #: called when the watch handed tasks back (the runner wakes a lane)
        self.on_hand_back: Callable[[int], None] = _ignore
        #: called when a batch begins (the runner tells the commit watch)
        self.on_start: Callable[[], None] = _nothing

    # ------------------------------------------------------- the lane's side
    def start(
        self,
        claim_conn: Connection,
        work_conn: Connection,
        tasks: list[TaskRecord],
        *,
        events: bool,
    ) -> None:
        self.wants_events = events
        self.claim_conn, self.work_conn = claim_conn, work_conn
        self.batch = tasks
        self.waiting = deque(tasks)
        self.locked = {task.id for task in tasks}
        self.may_hand_back = True
        self.handed_back = []
        self.succeeded = self.failed = 0
        self.group = Group(events=[] if self.wants_events else None)
        self.on_start()  # after the batch is in place: the watch must see it

    def end(self) -> list[int]:
        """The batch is over: the ids of tasks never started (handed back
        already, or about to be)."""
        left = [task.id for task in self.waiting]
        self.waiting.clear()
        self.running = None
        self.claim_conn = self.work_conn = None
        self.transaction = None
        self.oldest = None
        return left

    def begin_task(self, task: TaskRecord) -> None:
        self.running = task
        self.running_since = time.perf_counter()
        self.joined = False

    def add_outcome(self, task: TaskRecord, event: TaskEvent | None) -> None:
        """Record a finished task in the open group (its success or failure
        the caller has put there)."""
        group = self.group
        group.tasks.append(task)
        if event is not None and group.events is not None:
            group.events.append(event)
        if self.oldest is None:
            self.oldest = time.perf_counter()
        self.running = None

    def take_group(self) -> Group:
        group, self.group = self.group, Group(events=[] if self.wants_events else None)
        self.oldest = None
        return group

    def due(self, now: float) -> bool:
        """Whether the oldest outcome waiting has waited the budget."""
        return self.oldest is not None and now - self.oldest >= self.budget

    def join(self, *, flush_others: bool = True) -> bool:
        """The running handler's first statement: its transaction. Outcomes
        of other tasks waiting in the open one are committed first, unless
        the join policy lets it join them (``flush_others`` false: a
        failure's own rows, written at once, join them). Whether the
        transaction holds nothing else (the handler needs no savepoint)."""
        assert self.work_conn is not None
        with self.gate:
            now = time.perf_counter()
            self.joined = True
            self.joined_at = now
            if flush_others and self.group and not self.may_join(self, now):
                self.flush(self, False)
            if self.transaction is None or not self.transaction.is_active:
                self.transaction = self.work_conn.begin()
            return not self.group


class LaneSession(Session):
    """The handler's Session: on the lane's work connection, in the batch's
    transaction, which it opens (:meth:`Lane.join`) only when the handler
    first needs the database. In a SAVEPOINT where the transaction holds
    other tasks' outcomes, so that a failing handler's writes roll back
    alone; where it holds nothing else, in the transaction itself
    (``rollback_only``: the Session's commit flushes and commits nothing,
    its rollback rolls back the transaction): two round trips fewer."""

    def __init__(self, lane: Lane) -> None:
        assert lane.work_conn is not None
        super().__init__(
            bind=lane.work_conn, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        self._lane: Lane | None = lane

    def get_bind(self, mapper: Any = None, **kw: Any) -> Any:
        lane = self._lane
        if lane is not None:
            self._lane = None
            if lane.work_conn is not self.bind:
                # a handler the lane abandoned (a time limit) with its connection
                raise ResourceClosedError("this handler's connection was given up by its lane")
            if lane.join():
                self.join_transaction_mode = "rollback_only"
        return super().get_bind(mapper, **kw)


class JoinPolicy:
    """Whether a handler's first statement may join a transaction holding
    other tasks' finished outcomes (they then wait for it to end), or must
    commit them first (one more commit). It may when the transaction holds
    fewer than ``MAX_JOINED`` outcomes, the oldest has waited less than
    three quarters of the budget, the handler reached the database within a
    quarter of it, and its process is not kept apart: a handler that ran
    longer than half the budget after its first statement keeps its
    process's handlers apart for ``memory`` times that run (a 5 s run: 50 s;
    a 30 ms stall of a loaded machine: 0.3 s). So the one long run that
    nothing warned of holds at most ``MAX_JOINED`` outcomes, once
    (docs/lifecycle.md#the-batch-transaction)."""

    #: the most finished outcomes a handler's transaction may hold when it joins
    MAX_JOINED = 3

    def __init__(self, budget_seconds: float, memory: float = 10.0) -> None:
        self.budget = budget_seconds
        self.memory = memory
        #: process -> perf_counter() until which its handlers are kept apart
        self._apart: dict[str, float] = {}

    def may_join(self, lane: Lane, now: float) -> bool:
        task = lane.running
        if task is None or lane.oldest is None or self.budget <= 0:
            return False
        if len(lane.group.tasks) >= self.MAX_JOINED:
            return False
        if now - lane.oldest >= self.budget * 0.75 or now - lane.running_since >= self.budget / 4:
            return False
        until = self._apart.get(task.process or "")
        return until is None or until <= now

    def finished(self, lane: Lane, task: TaskRecord, now: float) -> None:
        """``task``'s handler returned (or raised): remember a long run
        after its first statement."""
        if not lane.joined:
            return
        ran = now - lane.joined_at
        if ran >= self.budget / 2:
            until = now + self.memory * ran
            process = task.process or ""
            if until > self._apart.get(process, 0.0):
                self._apart[process] = until


def _never_join(lane: Lane, now: float) -> bool:
    return False


def _no_flush(lane: Lane, raising: bool) -> None:
    raise AssertionError("a lane outside a batch has nothing to commit")


def _ignore(count: int) -> None:
    return None


def _nothing() -> None:
    return None
