"""Leases: how a worker keeps its claim on the tasks it is running.

A claim marks a task ``processando`` with the worker's id (``worker_id``)
and a deadline (``lease_expires_at``). While the worker holds the task, a
heartbeat thread pushes the deadline ahead every third of the lease, on a
connection of its own, for every task of every lane in one statement. The
rescue takes a task only once its lease has expired (or, on PostgreSQL and
MariaDB, once the worker's per-task lock died with its connection: faster,
never the only proof).

Completion is guarded by the claim: the ``sucesso`` update of a batch
matches only rows still ``processando`` for this worker, and a batch whose
rows do not all match rolls back, handlers' work included. So a worker that
lost a task (its connection died, its lease ran out and another worker
rescued it) never commits that task's effects a second time. An expired
lease alone does not void a claim: while nobody has rescued the task, the
worker that holds it may still finish it, exactly once.

The heartbeat renews only the tasks this process still holds. A task it
gave up (its batch died with a connection) is not renewed, so its lease
runs out and the rescue consumes its attempt, even if the process lives on.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Engine

from ..adapters import Adapter
from ..common.redaction import describe_error
from ..config.ranges import DEFAULT_LEASE_SECONDS, LEASE_SECONDS
from ..schema.mixins import WORKER_ID_MAX_LENGTH

__all__ = ["Claims", "Heartbeat", "LeasePolicy", "new_worker_id"]

logger = logging.getLogger("sqla_queue.policies.leases")


def new_worker_id() -> str:
    """``host:pid:random``: unique per worker process, readable by operators."""
    host = socket.gethostname()[:60]
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:WORKER_ID_MAX_LENGTH]


@dataclass(frozen=True)
class LeasePolicy:
    """How long a claim lasts without a heartbeat (which beats three times a
    lease, the shortest held: :class:`Heartbeat`), and how often the rescue looks."""

    seconds: float = DEFAULT_LEASE_SECONDS

    def __post_init__(self) -> None:
        LEASE_SECONDS.check("lease_seconds", self.seconds)

    @property
    def rescue_every_seconds(self) -> float:
        """How often a worker looks for lost tasks: half a lease, so a dead
        worker's task waits at most one and a half leases."""
        return self.seconds / 2


class Claims:
    """The ids of the tasks this worker process holds, shared by its lanes.

    ``worker_id`` is one per process, so the database's guards cannot tell
    two lanes apart, and need not: a row goes back to ``pendente`` only by
    the hand-back of the lane that held it, which neither completes nor
    renews it afterwards, and every other path to a new attempt (the rescue,
    a retry) is a new row. What could tell them apart is this set: a lane
    whose batch ends after it handed a task back, when another lane of the
    process has claimed the same task again meanwhile (possible where there
    are no per-task locks: SQLite, client-server mode, PgBouncer), must not
    drop the other lane's claim, or the heartbeat would stop renewing it.
    So each id remembers the lane (thread) that added it, and a lane
    discards only its own."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        #: task id -> the lane (thread ident) that holds it
        self._ids: dict[int, int] = {}
        #: tasks whose lease is not the worker's (WorkerBase.lease_seconds_for)
        self._leases: dict[int, float] = {}
        self._lock = threading.Lock()

    def add(self, ids: Iterable[int]) -> None:
        lane = threading.get_ident()
        with self._lock:
            for task_id in ids:
                self._ids[task_id] = lane

    def set_lease(self, ids: Iterable[int], seconds: float) -> None:
        with self._lock:
            for task_id in ids:
                if task_id in self._ids:
                    self._leases[task_id] = seconds

    def discard(self, ids: Iterable[int]) -> None:
        """Forget this lane's claims of ``ids`` (another lane's stay)."""
        lane = threading.get_ident()
        with self._lock:
            for task_id in ids:
                if self._ids.get(task_id) == lane:
                    del self._ids[task_id]
                    self._leases.pop(task_id, None)

    def snapshot(self) -> list[int]:
        with self._lock:
            return sorted(self._ids)

    def by_lease(self, default: float) -> dict[float, list[int]]:
        """The held ids grouped by their lease in seconds."""
        with self._lock:
            groups: dict[float, list[int]] = {}
            for task_id in sorted(self._ids):
                groups.setdefault(self._leases.get(task_id, default), []).append(task_id)
            return groups


class Heartbeat:
    """A thread that renews the lease of every task in ``claims``."""

    def __init__(
        self, engine: Engine, adapter: Adapter, claims: Claims, policy: LeasePolicy
    ) -> None:
        self.engine = engine
        self.adapter = adapter
        self.claims = claims
        self.policy = policy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: set after each round that reached the database (tests wait on it)
        self.beat = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqla-queue-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def renew_once(self) -> int:
        groups = self.claims.by_lease(self.policy.seconds)
        if not groups:
            return 0
        renewed = 0
        with self.adapter.connect_claim(self.engine) as conn, conn.begin():
            for seconds, ids in groups.items():
                renewed += self.adapter.task_lease_renew(
                    conn, ids=ids, owner=self.claims.owner, lease_seconds=seconds
                )
        return renewed

    def _period(self) -> float:
        """A third of the shortest lease held (tasks may have their own)."""
        shortest = min(self.claims.by_lease(self.policy.seconds), default=self.policy.seconds)
        return min(shortest, self.policy.seconds) / 3

    def _run(self) -> None:
        while not self._stop.wait(self._period()):
            try:
                self.renew_once()
                self.beat.set()
            except Exception as exc:  # the database is away: the next beat tries again
                logger.warning("lease heartbeat failed: %s", describe_error(exc))
