"""PostgreSQL, sharing a queue with nsj-queue-lib 1.2.2's workers (opt-in).

The reference's worker locks a task with the session-level, single-key
``pg_try_advisory_lock(<task id>)`` on its main connection, re-reads the
row, runs it only if it is still ``pendente``, and releases the lock after
the task's outcome has committed; its retry thread (the rescue) takes the
same lock before it re-enqueues a ``processando`` row. sqla-queue's own
lock is the two-key ``(queue namespace, id)`` form, a different key: the
two libraries do not see each other's locks. Without this adapter, a
sqla-queue rescue takes a running reference task for a lost one (its
two-key lock is free), and a claim can mark ``processando`` a row the
reference has locked and read as ``pendente``: both then run it.

This adapter takes the reference's key too, so that whoever holds it is the
only one running the task:

- the claim's RETURNING list takes ``pg_try_advisory_lock(id)`` beside the
  two-key lock; a row that does not get both is handed back (to
  ``pendente``) and then the lock it did get is released, so the reference
  never sees a ``processando`` row of ours without its lock;
- both locks are released together, after the batch's outcome has
  committed, as the reference releases its own;
- the rescue's test of a lost row also requires the reference's key to be
  free (it is the reference's only proof of life: it has no lease), and the
  rescue takes it, for its transaction, on every row it re-enqueues, so the
  reference's retry thread and ours never both re-enqueue one row.

See docs/coming-from-nsj-queue-lib.md#running-both-libraries-at-once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, func, text
from sqlalchemy.sql.elements import ColumnElement

from ..common.exceptions import ConfigurationError
from ..schema.records import TaskRecord
from .postgresql import OVER_IDS, TASK_UNLOCK, PostgresAdapter, advisory_lock_free

__all__ = ["PostgresNsjAdapter"]


class PostgresNsjAdapter(PostgresAdapter):
    """:class:`PostgresAdapter` that also takes nsj-queue-lib's task lock."""

    def _prepare(self) -> None:
        if not self.task_locks:
            # adapter_for refuses this first, in the user's terms
            raise ConfigurationError("nsj-queue-lib's locks need sqla-queue's task locks")
        super()._prepare()
        # single-key advisory locks, the reference's key: the raw task id
        self._nsj_unlock = text(f"SELECT count(pg_advisory_unlock(x)) {OVER_IDS}")
        # both keys in one round trip, for lock_release_many
        self._ns_unlock = self._unlock
        self._unlock = text(
            f"SELECT count({TASK_UNLOCK}), count(pg_advisory_unlock(x)) {OVER_IDS}"
        ).bindparams(ns=self.task_lock_namespace)
        self._nsj_rescue_lock = text(f"SELECT x {OVER_IDS} WHERE pg_try_advisory_xact_lock(x)")

    def _claim_locks(self) -> list[ColumnElement[Any]]:
        nsj = func.pg_try_advisory_lock(self.table.c.id).label("sqlaq_nsj_locked")
        return [*super()._claim_locks(), nsj]

    def _keep_locked(
        self, conn: Connection, keys: Sequence[str], rows: Sequence[Sequence[Any]], owner: str
    ) -> list[Sequence[Any]]:
        id_at, ours_at = keys.index("id"), keys.index("sqlaq_locked")
        nsj_at = keys.index("sqlaq_nsj_locked")
        refused = [row for row in rows if not (row[ours_at] and row[nsj_at])]
        if not refused:
            return list(rows)
        self.task_hand_back_many(conn, ids=[row[id_at] for row in refused], owner=owner)
        # after the hand-back: a 'processando' row of ours with its
        # reference lock free would look lost to the reference's retry thread
        ours = [row[id_at] for row in refused if row[ours_at]]
        if ours:
            conn.execute(self._ns_unlock, {"ids": ours})
        nsj = [row[id_at] for row in refused if row[nsj_at]]
        if nsj:
            conn.execute(self._nsj_unlock, {"ids": nsj})
        return [row for row in rows if row[ours_at] and row[nsj_at]]

    def _lease_lost(self) -> ColumnElement[bool]:
        quoted = self._quoted()
        nsj_free = advisory_lock_free(
            objsubid=1,
            classid=f"CAST({quoted}.id >> 32 AS oid)",
            objid=f"CAST({quoted}.id & 4294967295 AS oid)",
        )
        return and_(nsj_free, super()._lease_lost())

    def task_rescue_lost(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        lost = super().task_rescue_lost(conn, limit=limit)
        if not lost:
            return lost
        # held until the rescue commits: a reference retry thread that
        # tries the key meanwhile gives up, and afterwards finds the row
        # no longer 'processando'
        ids = [task.id for task in lost]
        locked = set(conn.execute(self._nsj_rescue_lock, {"ids": ids}).scalars())
        return [task for task in lost if task.id in locked]
