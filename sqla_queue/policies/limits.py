"""Fleet-wide concurrency limits: at most N tasks of a process running at
once, across every worker process and lane of the queue.

A worker class declares them::

    class Faturar(WorkerBase):
        model = Task
        concurrency_limits = {"emitir_nfe": 2}   # the tax office allows two

Each claim of a limited process runs in a transaction of its own (on
PostgreSQL too, whose claims otherwise run in autocommit), under a lock of
that process (PostgreSQL: ``pg_advisory_xact_lock``; MySQL family:
``GET_LOCK``, freed after the commit; SQLite: the claim's write lock,
``BEGIN IMMEDIATE``): it counts the process's running tasks
(``processando``, every worker's: a task counts from its claim until its
attempt is recorded, and a dead worker's until the rescue frees it) and
claims at most the difference. The claims of the other processes leave the
limited ones out and run as before, with no lock. The composition root
(``QueueApp``) builds it; the manager calls it before its own claim.

Rate limits work the same way, under the same lock::

    class Faturar(WorkerBase):
        model = Task
        rate_limits = {"enviar_email": 5}   # tasks per second, fleet-wide

a token bucket per process (one second's worth of tokens at most, refilled
at the rate by the database's clock) kept in a row of the queue's
configuration table, read with a locking read and written in the claim's
transaction: a claim takes at most as many tasks as there are whole
tokens. A lane whose claim the bucket cut short waits until the next token
(``retry_in``), not for a wake-up.

Two worker classes that declare different limits for the same process
each keep their own: declare a process's limit in one place (a common
base class). A limit per key (at most N running tasks of each tenant) is
fairness.py's ``key_concurrency_limit``, under the same kind of lock.
"""

from __future__ import annotations

import contextlib
import contextvars
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from ..adapters import Adapter
from ..adapters.limits import LimitQueries, RateBuckets
from ..common.exceptions import ConfigurationError
from ..schema.records import TaskRecord

__all__ = [
    "LimitedClaims",
    "check_limits",
    "check_rate",
    "check_rates",
    "claim_within_rate",
    "under_lock",
]

#: seconds a claim waits for another worker's claim of the same process
LOCK_WAIT_SECONDS = 30.0
#: the rates a process may be limited to, in tasks per second
MIN_RATE = 0.001
MAX_RATE = 1_000_000.0


@contextlib.contextmanager
def under_lock(conn: Connection, adapter: Adapter, namespace: int, bucket: int) -> Iterator[None]:
    """A transaction on ``conn`` under the fleet-wide lock (``namespace``,
    ``bucket``): a count and a claim in it see no other worker's claim of
    the same bucket between them. Where claims run in autocommit
    (PostgreSQL), this one does not; a lock that outlives the commit
    (``GET_LOCK``) is freed after it."""
    name = None
    if adapter.claim_autocommit:
        conn.execution_options(isolation_level="READ COMMITTED")
    try:
        with conn.begin():
            name = adapter.bucket_lock(
                conn, namespace=namespace, bucket=bucket, wait_seconds=LOCK_WAIT_SECONDS
            )
            yield
    finally:
        if name is not None:
            adapter.bucket_unlock(conn, name)  # after the commit (GET_LOCK outlives it)
            if conn.in_transaction():
                conn.commit()
        if adapter.claim_autocommit:
            conn.execution_options(isolation_level="AUTOCOMMIT")


def check_limits(limits: Any, owner: str) -> dict[str, int]:
    """``concurrency_limits`` checked: a mapping of process to a positive
    int; a one-line ``ConfigurationError`` otherwise."""
    if not isinstance(limits, Mapping):
        raise ConfigurationError(
            f"{owner}.concurrency_limits must be a mapping of process to a number, not {limits!r}"
        )
    checked: dict[str, int] = {}
    for process, limit in limits.items():
        if not isinstance(process, str) or not process.strip():
            raise ConfigurationError(
                f"{owner}.concurrency_limits: a process must be a non-empty string, not {process!r}"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(
                f"{owner}.concurrency_limits[{process!r}] must be a whole number of at least 1, "
                f"not {limit!r}"
            )
        checked[process] = limit
    return checked


def check_rates(rates: Any, owner: str) -> dict[str, float]:
    """``rate_limits`` checked: a mapping of process to a positive number of
    tasks per second; a one-line ``ConfigurationError`` otherwise."""
    if not isinstance(rates, Mapping):
        raise ConfigurationError(
            f"{owner}.rate_limits must be a mapping of process to tasks per second, not {rates!r}"
        )
    checked: dict[str, float] = {}
    for process, rate in rates.items():
        if not isinstance(process, str) or not process.strip():
            raise ConfigurationError(
                f"{owner}.rate_limits: a process must be a non-empty string, not {process!r}"
            )
        checked[process] = check_rate(rate, f"{owner}.rate_limits[{process!r}]")
    return checked


def check_rate(rate: Any, what: str) -> float:
    """A rate in tasks per second (``what`` names it in the one-line
    ``ConfigurationError`` of a bad one)."""
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not MIN_RATE <= rate <= MAX_RATE
    ):
        raise ConfigurationError(
            f"{what} must be a number of tasks per second from {MIN_RATE} to {MAX_RATE:g}, "
            f"not {rate!r}"
        )
    return float(rate)


class LimitedClaims:
    """The claims of the limited processes (see the module)."""

    def __init__(
        self,
        limits: Mapping[str, int],
        adapter_for: Callable[[str], Adapter],
        queries: LimitQueries,
        namespace: str,
        rates: Mapping[str, float] | None = None,
        buckets: RateBuckets | None = None,
    ) -> None:
        self.limits = dict(limits)
        self.rates = dict(rates or {})
        self.buckets = buckets
        if self.rates and buckets is None:
            raise ConfigurationError("rate limits need the queue's configuration table")
        #: one adapter per limited process, its claim taking only that process
        self.adapters = {
            process: adapter_for(process) for process in set(self.limits) | set(self.rates)
        }
        self.queries = queries
        self.namespace = zlib.crc32(namespace.encode()) & 0x7FFFFFFF
        #: paused processes (pause.py): not claimed
        self.paused: frozenset[str] = frozenset()
        #: what the last claim of the calling lane found (capped, retry_in):
        #: a worker's lanes share this object, each reads its own. A context
        #: variable, as each thread has its context, and so has each
        #: greenlet an async worker's lanes run in (worker/aio.py)
        self._last: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
            f"sqla_queue_limits_{id(self)}", default=None
        )
        self._turn = 0

    @property
    def capped(self) -> bool:
        """This lane's last claim took every free slot of a process: more
        may wait, and no wake-up will say so when those tasks finish."""
        return bool(self._lane().get("capped", False))

    @capped.setter
    def capped(self, value: bool) -> None:
        self._lane()["capped"] = value

    @property
    def retry_in(self) -> float | None:
        """Seconds until a rate-limited process whose bucket cut this lane's
        last claim short has a token again (None: none did)."""
        found: float | None = self._lane().get("retry_in")
        return found

    @retry_in.setter
    def retry_in(self, value: float | None) -> None:
        self._lane()["retry_in"] = value

    def _lane(self) -> dict[str, Any]:
        last = self._last.get()
        if last is None:
            last = {}
            self._last.set(last)
        return last

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        """Up to ``limit`` tasks of the limited processes, each process in
        its own transaction and never past its limits; the processes take
        turns being first."""
        order = sorted(self.adapters)
        self._turn = (self._turn + 1) % len(order)
        self.capped = False
        self.retry_in = None
        tasks: list[TaskRecord] = []
        for process in order[self._turn :] + order[: self._turn]:
            if len(tasks) >= limit:
                break
            if process in self.paused:
                continue
            tasks += self._claim_one(conn, process, limit - len(tasks), owner, lease_seconds)
        return tasks

    def _claim_one(
        self, conn: Connection, process: str, limit: int, owner: str, lease_seconds: float
    ) -> Sequence[TaskRecord]:
        adapter = self.adapters[process]
        bucket = zlib.crc32(process.encode()) & 0x7FFFFFFF
        with under_lock(conn, adapter, self.namespace, bucket):
            free = limit
            if process in self.limits:
                free = self.limits[process] - self.queries.running(conn, process)
                if free <= 0:
                    return []  # other workers hold the slots: they claim again
            if process in self.rates:
                return self._claim_rated(conn, adapter, process, free, limit, owner, lease_seconds)
            taken = adapter.task_claim_many(
                conn, limit=min(free, limit), owner=owner, lease_seconds=lease_seconds
            )
            # every free slot taken: more may wait, and no wake-up will say
            # so when these finish; the lane claims again after its batch
            self.capped = self.capped or (process in self.limits and len(taken) == free)
            return taken

    def _claim_rated(
        self,
        conn: Connection,
        adapter: Adapter,
        process: str,
        free: int,
        limit: int,
        owner: str,
        lease_seconds: float,
    ) -> Sequence[TaskRecord]:
        """The token bucket's share of the claim (:func:`claim_within_rate`)."""
        assert self.buckets is not None
        taken, wait = claim_within_rate(
            conn,
            self.buckets,
            process,
            self.rates[process],
            self.queries.now(conn).timestamp(),
            min(free, limit),
            lambda count: adapter.task_claim_many(
                conn, limit=count, owner=owner, lease_seconds=lease_seconds
            ),
            note=f"rate limit bucket of process {process[:200]} (sqla-queue)",
        )
        if wait is not None:  # the bucket, not the queue, stopped this claim: more may wait
            self.retry_in = soonest(self.retry_in, wait)
        elif process in self.limits and len(taken) == free:
            self.capped = True
        return taken


def soonest(known: float | None, wait: float) -> float:
    """The sooner of a lane's known wait for a token (None: none yet) and ``wait``."""
    return wait if known is None else min(known, wait)


def claim_within_rate(
    conn: Connection,
    buckets: RateBuckets,
    subject: str,
    rate: float,
    now: float,
    want: int,
    claim: Callable[[int], Sequence[TaskRecord]],
    *,
    note: str,
) -> tuple[Sequence[TaskRecord], float | None]:
    """Claim (``claim(count)``) up to ``want`` tasks as ``subject``'s token
    bucket allows, under the caller's lock and in its transaction: its
    tokens refilled at ``rate`` since it was last written (``now``: the
    database's clock, in epoch seconds), up to one second's worth; one
    token a task. Returns the tasks and, when the bucket (not the queue)
    stopped the claim, the seconds until its next token."""
    capacity = max(1.0, rate)
    stored = buckets.read(conn, subject)
    if stored is None:
        tokens = capacity
    else:
        tokens = min(capacity, stored[0] + max(0.0, now - stored[1]) * rate)
    take = min(want, int(tokens))
    taken: Sequence[TaskRecord] = []
    if take > 0:
        taken = claim(take)
    tokens -= len(taken)
    if taken or stored is None:  # else the stored state refills the same way
        buckets.write(conn, subject, tokens, now, rate=rate, exists=stored is not None, note=note)
    if len(taken) == take and take < want:
        return taken, max(0.0, (1.0 - tokens) / rate)
    return taken, None
