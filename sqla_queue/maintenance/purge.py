"""Purge: old finished chains are deleted, whole, in chunks.

A *chain* here is a task's every row: its attempts (``id_inicial``), its
dead-letter run (``live_id``, with the run's own attempts) and the chain
requeued from that run (``live_id`` too: the run is what says the task was
requeued, so the two go together, or the task could be requeued again). A
chain is deleted when none of its rows is open (``agendada``, ``pendente``,
``processando``) and its newest row's ``data_hora`` is older than
``QUEUE_PURGE_MAX_AGE`` days (chains that went to the dead letter:
``dead_letter_retention`` days, when set). Never part of a chain: a retry
would lose its payload (kept on the first attempt), a dashboard its history.
The reference deleted row by row on age alone, running tasks included.

Rows are visited oldest id first, a bounded batch at a time; the chains
they belong to are read whole (by ``id``, ``id_inicial`` and ``live_id``,
each indexed), and the closed old ones are deleted in chunks of about
``QUEUE_PURGE_LIMIT`` rows, a transaction each, at most
``QUEUE_PURGE_ROUND_LIMIT`` chunks per round.

Then the workflows (docs/workflows.md, "Retention"): a workflow none of
whose steps has a task row left (this purge, or an operator, deleted them
all) loses its rows in the workflow tables (``adapters/workflow_purge.py``).
Workflows are visited by id, a batch of about ``QUEUE_PURGE_LIMIT`` steps
per transaction, which tests and deletes in one go; at most
``QUEUE_PURGE_ROUND_LIMIT`` transactions that delete per round. A workflow
with any task row left, whatever its status, keeps every row. A queue made
before the workflow tables has none of these counts.

A worker with rate limits also hands the purge its token buckets
(``adapters/limits.py``): after the chains, one transaction deletes the
buckets full by now (what no row means), so a key seen once does not keep
a row of the configuration table forever.

``before_delete(conn, table, chain_ids)`` runs in each chunk's transaction
just before its ``DELETE``, with the first-attempt ids of the chunk's
chains; it may read and copy them (an archive). If it raises, the chunk's
transaction rolls back, nothing of it is deleted, and the round stops and
reports the error.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Table

from ..adapters import Adapter
from ..adapters.limits import RateBuckets
from ..adapters.maintenance import FamilyRow, family_key
from ..common.redaction import describe_error
from ..config.ranges import PURGE_LIMIT, PURGE_MAX_AGE_DAYS, PURGE_ROUNDS
from ..config.timing import Schedule
from ..schema.mixins import OPEN_STATUSES
from .base import Routine, RoutineResult
from .clock import Clock

__all__ = ["BeforeDelete", "PurgeConfig", "PurgeRoutine"]

logger = logging.getLogger("sqla_queue.maintenance")

BeforeDelete = Callable[[Connection, Table, Sequence[int]], None]


@dataclass(frozen=True)
class PurgeConfig:
    #: chains whose newest row is older than this many days are deleted
    max_age_days: float = 60.0
    #: for chains that went to the dead letter; None: max_age_days
    dead_letter_max_age_days: float | None = None
    #: rows per chunk (one DELETE and one transaction)
    limit: int = 1000
    #: chunks per round at most
    rounds: int = 100
    #: called in each chunk's transaction before its DELETE (an archive)
    before_delete: BeforeDelete | None = None

    def __post_init__(self) -> None:
        PURGE_MAX_AGE_DAYS.check("QUEUE_PURGE_MAX_AGE", self.max_age_days)
        if self.dead_letter_max_age_days is not None:
            PURGE_MAX_AGE_DAYS.check("dead_letter_retention", self.dead_letter_max_age_days)
        PURGE_LIMIT.check("QUEUE_PURGE_LIMIT", self.limit)
        PURGE_ROUNDS.check("QUEUE_PURGE_ROUND_LIMIT", self.rounds)
        if self.before_delete is not None and not callable(self.before_delete):
            raise ValueError(f"before_delete must be callable, not {self.before_delete!r}")


@dataclass
class _Family:
    key: int
    rows: list[FamilyRow]

    @property
    def open(self) -> bool:
        return any(row[4] in OPEN_STATUSES for row in self.rows)

    @property
    def dead(self) -> bool:
        return any(row[2] for row in self.rows)

    def newest(self) -> dt.datetime | None:
        times = [row[5] for row in self.rows]
        return None if any(t is None for t in times) else max(t for t in times if t)


class PurgeRoutine(Routine):
    name = "purge"

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        schedule: Schedule,
        config: PurgeConfig | None = None,
        *,
        clock: Clock | None = None,
        buckets: RateBuckets | None = None,
    ) -> None:
        super().__init__(engine, adapter, schedule, clock=clock)
        self.config = config or PurgeConfig()
        #: the rate limits' token buckets, whose full ones go too (None: none)
        self.buckets = buckets

    def _round(self, dry_run: bool) -> RoutineResult:
        config = self.config
        now = self.clock.now()
        cutoff = now - dt.timedelta(days=config.max_age_days)
        dead_days = config.dead_letter_max_age_days
        dead_cutoff = cutoff if dead_days is None else now - dt.timedelta(days=dead_days)
        counts = {"chains": 0, "rows": 0, "chunks": 0, "open_chains_kept": 0}
        after = 0
        seen: set[int] = set()
        error = None
        with self.adapter.connect_maintenance(self.engine) as conn:
            while counts["chunks"] < config.rounds:
                with conn.begin():
                    scanned = self.queries.purge_scan(
                        conn, after=after, before=max(cutoff, dead_cutoff), limit=config.limit
                    )
                    if not scanned:
                        break
                    after = scanned[-1][0]
                    keys = list(dict.fromkeys(family_key((*row, None, None)) for row in scanned))
                    keys = [key for key in keys if key not in seen]
                    seen.update(keys)
                    families = self._families(conn, keys)
                old = []
                for family in families:
                    if family.open:
                        counts["open_chains_kept"] += 1
                        continue
                    newest = family.newest()
                    limit = dead_cutoff if family.dead else cutoff
                    if newest is not None and newest < limit:
                        old.append(family)
                for chunk in _chunks(old, config.limit):
                    if counts["chunks"] >= config.rounds:
                        break
                    try:
                        deleted = self._delete(conn, chunk, dry_run)
                    except Exception as exc:
                        error = describe_error(exc)
                        logger.error("purge stopped: %s", error)
                        break
                    counts["chunks"] += 1
                    counts["chains"] += len(chunk)
                    counts["rows"] += deleted
                    self._advanced(counts["rows"], counts)
                if error is not None:
                    break
        if error is None:
            try:
                workflows = self._purge_workflows(dry_run, counts)
            except Exception as exc:
                error = describe_error(exc)
                logger.error("purge of the workflow rows stopped: %s", error)
            else:
                counts.update(workflows)
        if self.buckets is not None and error is None:
            try:
                counts["rate_buckets"] = self._forget_full_buckets(self.buckets, dry_run)
            except Exception as exc:
                error = describe_error(exc)
                logger.error("purge of the rate limit buckets stopped: %s", error)
        return RoutineResult(self.name, counts, dry_run=dry_run, error=error)

    def _purge_workflows(self, dry_run: bool, counts: dict[str, int]) -> dict[str, int]:
        """The rows of the workflows without task rows, a batch a
        transaction; their counts, or none without the workflow tables."""
        queries = self.adapter.workflow_purge
        limit = self.config.limit
        done = {"workflows": 0, "workflow_rows": 0}
        after, chunks = 0, 0
        with self.adapter.connect_maintenance(self.engine) as conn:
            with conn.begin():
                if not queries.tables_exist(conn):
                    return {}
            while chunks < self.config.rounds:
                with conn.begin():
                    scanned = queries.workflow_scan(conn, after=after, limit=limit)
                    if not scanned:
                        break
                    batch = list(dict.fromkeys(scanned))
                    if len(scanned) == limit and len(batch) > 1:
                        batch.pop()  # its steps may go on past the scan: the next batch's
                    after = batch[-1]
                    steps = queries.workflow_steps(conn, workflow_ids=batch)
                    alive = queries.steps_alive(conn, step_ids=[step for step, _ in steps])
                    kept = {workflow for step, workflow in steps if step in alive}
                    gone = [workflow for workflow in batch if workflow not in kept]
                    if not gone:
                        continue
                    purge = queries.workflow_rows_count if dry_run else queries.workflow_rows_delete
                    gone_steps = [step for step, workflow in steps if workflow not in kept]
                    done["workflow_rows"] += purge(conn, workflow_ids=gone, step_ids=gone_steps)
                done["workflows"] += len(gone)
                chunks += 1
                self._advanced(counts["rows"] + done["workflow_rows"], {**counts, **done})
        return done

    def _forget_full_buckets(self, buckets: RateBuckets, dry_run: bool) -> int:
        """Every page of the buckets, a transaction each; how many went."""
        forgotten = 0
        after: str | None = ""
        clock = self.adapter.limits
        with self.adapter.connect_maintenance(self.engine) as conn:
            while after is not None:
                with conn.begin():
                    now = clock.now(conn).timestamp()  # the buckets' clock
                    count, after = buckets.forget_full(conn, now, after=after, dry_run=dry_run)
                forgotten += count
        return forgotten

    def _families(self, conn: Connection, keys: list[int]) -> list[_Family]:
        if not keys:
            return []
        by_key: dict[int, list[FamilyRow]] = {key: [] for key in keys}
        for row in self.queries.family_rows(conn, keys=keys):
            family = by_key.get(family_key(row))
            if family is not None:
                family.append(row)
        return [_Family(key, rows) for key, rows in by_key.items() if rows]

    def _delete(self, conn: Connection, chunk: list[_Family], dry_run: bool) -> int:
        ids = [row[0] for family in chunk for row in family.rows]
        if dry_run:
            return len(ids)
        with conn.begin():
            hook = self.config.before_delete
            if hook is not None:
                hook(conn, self.adapter.table, [family.key for family in chunk])
            return self.queries.delete_ids(conn, ids=ids)


def _chunks(families: list[_Family], limit: int) -> list[list[_Family]]:
    """Whole chains, about ``limit`` rows per chunk (a bigger chain alone)."""
    chunks: list[list[_Family]] = []
    current: list[_Family] = []
    size = 0
    for family in families:
        if current and size + len(family.rows) > limit:
            chunks.append(current)
            current, size = [], 0
        current.append(family)
        size += len(family.rows)
    if current:
        chunks.append(current)
    return chunks
