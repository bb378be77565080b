"""Per-key fairness: one key's backlog does not starve another key's tasks.

A worker with ``fair_by = "tenant"`` (any column the model lists in
``__queue_fair_by__``, which makes the index the claim reads) claims in
turns by key instead of in plain claim order (priority, time, id). Each
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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Table

from .adapters import Adapter
from .adapters.base import FAIR_KEY
from .adapters.fairness import FairnessQueries
from .exceptions import ConfigurationError
from .mixins import fair_columns
from .records import TaskRecord

__all__ = ["KEYS_PER_CLAIM", "FairClaims", "check_fair_by"]

#: the most keys one claim serves (a turn over more keys takes more claims)
KEYS_PER_CLAIM = 16


def check_fair_by(value: Any, owner: str, model: type, table: Table) -> str | None:
    """A worker's ``fair_by``: None, or a column the model lists in
    ``__queue_fair_by__`` (whose index the fair claim reads)."""
    if value is None:
        return None
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


class FairClaims:
    """The claims of a worker with ``fair_by`` (see the module): the
    manager's claim source, in place of its adapter's plain claim."""

    def __init__(
        self,
        plain: Adapter,
        adapter_for: Callable[[bool], Adapter],
        queries: FairnessQueries,
    ) -> None:
        #: the plain claim: what the shares leave of a batch
        self.plain = plain
        #: the claim of one key (FAIR_KEY) and of the rows without a key
        self.keyed = adapter_for(False)
        self.unkeyed = adapter_for(True)
        self.queries = queries
        #: the key the last claim served last: the next turn starts after it
        self.last: Any = None

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        keys = self.queries.keys(conn, after=self.last, limit=min(limit, KEYS_PER_CLAIM))
        unkeyed = self.queries.unkeyed(conn)
        groups = len(keys) + (1 if unkeyed else 0)
        if groups <= 1:
            # one key (or none): nothing to be fair between
            return self.plain.task_claim_many(
                conn, limit=limit, owner=owner, lease_seconds=lease_seconds
            )
        share = max(1, limit // groups)
        shares: list[list[TaskRecord]] = []
        taken = 0
        for key in keys:
            if taken >= limit:
                break
            token = FAIR_KEY.set(key)
            try:
                shares.append(
                    self.keyed.task_claim_many(
                        conn,
                        limit=min(share, limit - taken),
                        owner=owner,
                        lease_seconds=lease_seconds,
                    )
                )
            finally:
                FAIR_KEY.reset(token)
            taken += len(shares[-1])
            self.last = key
        if unkeyed and taken < limit:
            shares.append(
                self.unkeyed.task_claim_many(
                    conn, limit=min(share, limit - taken), owner=owner, lease_seconds=lease_seconds
                )
            )
            taken += len(shares[-1])
        if taken < limit:
            shares.append(
                self.plain.task_claim_many(
                    conn, limit=limit - taken, owner=owner, lease_seconds=lease_seconds
                )
            )
        return _interleaved(shares)


def _interleaved(shares: Sequence[list[TaskRecord]]) -> list[TaskRecord]:
    """The batch as the manager runs it, one task of each share in turn:
    the first task of each key runs before the second of any."""
    ordered: list[TaskRecord] = []
    queues = [list(share) for share in shares if share]
    while queues:
        ordered += [queue.pop(0) for queue in queues]
        queues = [queue for queue in queues if queue]
    return ordered
