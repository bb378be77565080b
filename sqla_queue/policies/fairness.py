"""Per-key fairness: one key's backlog does not starve another key's tasks.

A worker with ``fair_by = "tenant"`` (any column the model lists in
``__queue_fair_by__``, which makes the index the claim reads; or
``"payload.<key>"``, a column the model fills from that payload key:
payload_keys.py) claims in turns by key instead of in plain claim order
(priority, time, id). Each
claim:

1. finds up to :data:`KEYS_PER_CLAIM` keys that have ready tasks, starting
   after the key the previous claim of this worker served last and going
   round from the smallest (``adapters/fairness.py``: the keys are skipped
   through in the index, one probe a key however large its backlog);
2. takes an equal share of the batch from each of them, and one share from
   the tasks without a key (NULL), each in claim order within its key;
3. fills what is left of the batch in plain claim order.

So with a backlog of 100,000 tasks of tenant 1 and 10 of tenant 2, every
claim takes tasks of both, and tenant 2's wait is one claim, not 100,000
tasks. Priorities still order the tasks within a key; between keys the
turn decides (a task of priority 9 of one key waits for the other keys'
shares). Workers share nothing: each keeps its own turn, and their claims
interleave.

Each share is the adapter's own claim statement with the key bound
(``ClaimFilter.fair_column`` reads :data:`~sqla_queue.adapters.base.FAIR_KEY`
as it runs), so SKIP LOCKED, per-task locks, leases, routing and paused
processes hold as in any claim. Processes with a fleet-wide concurrency or
rate limit (limits.py) are claimed apart, by their limits, not by key.

``key_concurrency_limit = 2`` on the worker caps each key at 2 running
tasks across the whole fleet: each key's share is claimed in a transaction
of its own under a lock of that key (as limits.py locks a process), which
counts the key's running tasks and claims at most the difference; the
shares then leave nothing to a plain-order top-up.

``key_rate_limit = 5`` caps each key at 5 claimed tasks a second across
the fleet, under the same lock: a token bucket per key (limits.py's, one
second's worth at most, refilled by the database's clock) in a row of the
queue's configuration table. A lane whose keys are all out of tokens waits
for the soonest next token, not for a wake-up. The two limits combine.
Rows without a key are limited by neither.
"""

from __future__ import annotations

import contextvars
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Table

from ..adapters import Adapter
from ..adapters.base import FAIR_KEY
from ..adapters.fairness import FairnessQueries
from ..adapters.limits import RateBuckets
from ..common.exceptions import ConfigurationError
from ..schema.mixins import fair_columns
from ..schema.payload_keys import column_of
from ..schema.records import TaskRecord
from .limits import check_rate, claim_within_rate, soonest, under_lock

__all__ = [
    "KEYS_PER_CLAIM",
    "FairClaims",
    "check_fair_by",
    "check_key_limit",
    "check_key_rate",
]

#: the most keys one claim serves (a turn over more keys takes more claims)
KEYS_PER_CLAIM = 16
#: ``fair_by = "payload.<key>"``: the column filled from that payload key
PAYLOAD_PREFIX = "payload."


def check_fair_by(value: Any, owner: str, model: type, table: Table) -> str | None:
    """A worker's ``fair_by``: None, or a column the model lists in
    ``__queue_fair_by__`` (whose index the fair claim reads), named itself
    or, for a column filled from a payload key (payload_keys.py), as
    ``"payload.<key>"``. Returns the column's name."""
    if value is None:
        return None
    if isinstance(value, str) and value.startswith(PAYLOAD_PREFIX):
        key = value[len(PAYLOAD_PREFIX) :]
        column = column_of(table, key)
        if column is None:
            raise ConfigurationError(
                f"{owner}.fair_by = {value!r}: no column of {table.name} is filled from "
                f"payload key {key!r}: declare one, e.g. "
                f"cliente = payload_key({key!r}), and list it in __queue_fair_by__"
            )
        value = column
    if not isinstance(value, str) or value not in table.c:
        raise ConfigurationError(
            f"{owner}.fair_by must be the name of a column of {table.name}, not {value!r}"
        )
    if value not in fair_columns(model, table):
        raise ConfigurationError(
            f"{owner}.fair_by = {value!r}: add it to {model.__name__}.__queue_fair_by__ "
            f"(the index of a fair claim: ix_{table.name}_justo_{value}) and create it"
        )
    return value


def check_key_limit(value: Any, owner: str, fair_by: str | None) -> int | None:
    """A worker's ``key_concurrency_limit``: None, or a whole number of at
    least 1 on a worker with ``fair_by`` (the key it limits)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{owner}.key_concurrency_limit must be a whole number of at least 1, not {value!r}"
        )
    if fair_by is None:
        raise ConfigurationError(
            f"{owner}.key_concurrency_limit limits the tasks of each key of fair_by: set fair_by"
        )
    return value


def check_key_rate(value: Any, owner: str, fair_by: str | None) -> float | None:
    """A worker's ``key_rate_limit``: None, or tasks per second (limits.py's
    range) on a worker with ``fair_by`` (the key it limits)."""
    if value is None:
        return None
    rate = check_rate(value, f"{owner}.key_rate_limit")
    if fair_by is None:
        raise ConfigurationError(
            f"{owner}.key_rate_limit limits the tasks of each key of fair_by: set fair_by"
        )
    return rate


class FairClaims:
    """The claims of a worker with ``fair_by`` (see the module): the
    manager's claim source. With ``key_limit`` or ``key_rate``, each key's
    share is claimed under a fleet-wide lock of the key, and never past
    ``key_limit`` running tasks of that key (counted in the same
    transaction) or past its token bucket in ``buckets``."""

    def __init__(
        self,
        plain: Adapter,
        adapter_for: Callable[[bool], Adapter],
        queries: FairnessQueries,
        *,
        key_limit: int | None = None,
        key_rate: float | None = None,
        buckets: RateBuckets | None = None,
        namespace: str = "",
    ) -> None:
        if key_rate is not None and buckets is None:
            raise ConfigurationError("a rate limit per key needs the queue's configuration table")
        #: the plain claim: what the shares leave of a batch
        self.plain = plain
        #: the claim of one key (FAIR_KEY) and of the rows without a key
        self.keyed = adapter_for(False)
        self.unkeyed = adapter_for(True)
        self.queries = queries
        self.key_limit = key_limit
        self.key_rate = key_rate
        self.buckets = buckets
        self.limited = key_limit is not None or key_rate is not None
        #: the database's clock, for the key buckets' refill
        self.clock = plain.limits if key_rate is not None else None
        self.namespace = zlib.crc32(namespace.encode()) & 0x7FFFFFFF
        #: the key the last claim served last: the next turn starts after it
        self.last: Any = None
        #: whether the calling lane's last claim took every free slot of a
        #: key (more may wait; no wake-up says so when its tasks finish)
        self._capped: contextvars.ContextVar[bool] = contextvars.ContextVar(
            f"sqla_queue_fair_capped_{id(self)}", default=False
        )
        #: seconds until the soonest next token of a key whose bucket cut
        #: the calling lane's last claim short (None: none did)
        self._retry_in: contextvars.ContextVar[float | None] = contextvars.ContextVar(
            f"sqla_queue_fair_retry_in_{id(self)}", default=None
        )

    @property
    def capped(self) -> bool:
        return self._capped.get()

    @property
    def retry_in(self) -> float | None:
        return self._retry_in.get()

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        self._capped.set(False)
        self._retry_in.set(None)
        if not self.limited:
            with conn.begin():
                return self.task_claim_many(
                    conn, limit=limit, owner=owner, lease_seconds=lease_seconds
                )
        with conn.begin():
            keys, unkeyed = self._turn(conn, limit)

        def unkeyed_share(count: int) -> list[TaskRecord]:  # no key, no limit
            with conn.begin():
                return self.unkeyed.task_claim_many(
                    conn, limit=count, owner=owner, lease_seconds=lease_seconds
                )

        shares = self._shares(
            keys,
            unkeyed,
            limit,
            lambda key, count: self._limited_share(conn, key, count, owner, lease_seconds),
            unkeyed_share,
        )
        return _interleaved(shares)

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        """The fair claim in the caller's transaction (no key limit)."""
        keys, unkeyed = self._turn(conn, limit)
        if len(keys) + unkeyed <= 1:
            # one key (or none): nothing to be fair between
            return self.plain.task_claim_many(
                conn, limit=limit, owner=owner, lease_seconds=lease_seconds
            )
        shares = self._shares(
            keys,
            unkeyed,
            limit,
            lambda key, count: self._keyed_claim(conn, key, count, owner, lease_seconds),
            lambda count: self.unkeyed.task_claim_many(
                conn, limit=count, owner=owner, lease_seconds=lease_seconds
            ),
        )
        taken = sum(len(share) for share in shares)
        if taken < limit:
            shares.append(
                self.plain.task_claim_many(
                    conn, limit=limit - taken, owner=owner, lease_seconds=lease_seconds
                )
            )
        return _interleaved(shares)

    def _turn(self, conn: Connection, limit: int) -> tuple[list[Any], bool]:
        """The keys this claim serves, and whether rows without a key wait."""
        keys = self.queries.keys(conn, after=self.last, limit=min(limit, KEYS_PER_CLAIM))
        return keys, self.queries.unkeyed(conn)

    def _shares(
        self,
        keys: Sequence[Any],
        unkeyed: bool,
        limit: int,
        key_share: Callable[[Any, int], list[TaskRecord]],
        unkeyed_share: Callable[[int], list[TaskRecord]],
    ) -> list[list[TaskRecord]]:
        """An equal share of ``limit`` from each key in turn, then from the
        rows without a key; the turn moves on past each key served."""
        share = max(1, limit // max(1, len(keys) + (1 if unkeyed else 0)))
        shares: list[list[TaskRecord]] = []
        taken = 0
        for key in keys:
            if taken >= limit:
                break
            shares.append(key_share(key, min(share, limit - taken)))
            taken += len(shares[-1])
            self.last = key
        if unkeyed and taken < limit:
            shares.append(unkeyed_share(min(share, limit - taken)))
        return shares

    def _keyed_claim(
        self, conn: Connection, key: Any, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        token = FAIR_KEY.set(key)
        try:
            return self.keyed.task_claim_many(
                conn, limit=limit, owner=owner, lease_seconds=lease_seconds
            )
        finally:
            FAIR_KEY.reset(token)

    def _limited_share(
        self, conn: Connection, key: Any, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        bucket = zlib.crc32(repr(key).encode()) & 0x7FFFFFFF
        with under_lock(conn, self.keyed, self.namespace, bucket):
            slots = None
            if self.key_limit is not None:
                slots = self.key_limit - self.queries.running(conn, key)
                if slots <= 0:
                    return []  # other workers hold the key's slots
            want = limit if slots is None else min(slots, limit)
            wait = None
            taken: Sequence[TaskRecord]
            if self.key_rate is None:
                taken = self._keyed_claim(conn, key, want, owner, lease_seconds)
            else:
                buckets, clock = self.buckets, self.clock
                assert buckets is not None and clock is not None
                column = self.queries.column
                taken, wait = claim_within_rate(
                    conn,
                    buckets,
                    f"key\0{column}\0{key!r}",
                    self.key_rate,
                    clock.now(conn).timestamp(),
                    want,
                    lambda count: self._keyed_claim(conn, key, count, owner, lease_seconds),
                    note=f"rate limit bucket of {column} {key!r:.200} (sqla-queue)",
                )
            if wait is not None:  # the key's bucket stopped the claim: its next token
                self._retry_in.set(soonest(self._retry_in.get(), wait))
            elif slots is not None and len(taken) == slots:
                self._capped.set(True)  # every free slot taken: more may wait
            return list(taken)


def _interleaved(shares: Sequence[list[TaskRecord]]) -> list[TaskRecord]:
    """The batch as the manager runs it, one task of each share in turn:
    the first task of each key runs before the second of any."""
    ordered: list[TaskRecord] = []
    queues = [list(share) for share in shares if share]
    while queues:
        ordered += [queue.pop(0) for queue in queues]
        queues = [queue for queue in queues if queue]
    return ordered
