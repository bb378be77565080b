"""The Spark archive's statements (:mod:`sqla_queue.spark.archive`), beside
the adapter they extend.

A *family* is a task's whole history: its chain (``coalesce(id_inicial,
id)``), the dead-letter run it started and the chain requeued from that run
(both carry ``live_id``). The archive reads families whole on the purge's
connection (the hook) and deletes them whole, a chunk per transaction of
the caller's, each chunk checked (the job). Portable Core, built once per
queue table; the caller begins and commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table, and_, bindparam, case, delete, func, or_, select
from sqlalchemy.sql.elements import ColumnElement

from ..schema.mixins import OPEN_STATUSES

__all__ = ["IDS_PER_STATEMENT", "ArchiveQueries", "family_rows"]

#: ids (or families) per statement
IDS_PER_STATEMENT = 1000


def family_rows(table: Table, roots: Sequence[int]) -> ColumnElement[bool]:
    """Every row of the families ``roots`` (chains, their dead-letter runs
    and the chains requeued from those), and no other family's: a requeued
    chain's own first attempt is not a root."""
    c = table.c
    return or_(
        and_(c.live_id.is_(None), func.coalesce(c.id_inicial, c.id).in_(list(roots))),
        c.live_id.in_(list(roots)),
    )


class ArchiveQueries:
    def __init__(self, table: Table) -> None:
        self.table = table
        c = table.c
        #: a row's family, as the purge's ``family_key``
        self._root = case(
            (c.live_id.is_not(None), c.live_id), else_=func.coalesce(c.id_inicial, c.id)
        )
        self._delete_closed = delete(table).where(
            c.id.in_(bindparam("ids", expanding=True)), c.status.not_in(OPEN_STATUSES)
        )

    def family_roots(self, conn: Connection, *, chain_ids: Sequence[int]) -> list[int]:
        """The families the rows of the chains ``chain_ids`` belong to (a
        dead-letter run named alone gives the family it came from)."""
        statement = select(self._root).where(family_rows(self.table, chain_ids)).distinct()
        return list(conn.execute(statement).scalars())

    def family_records(self, conn: Connection, *, roots: Sequence[int]) -> list[tuple[Any, ...]]:
        """Every row of the families ``roots``, each a tuple of the table's
        columns in their order."""
        result = conn.execute(select(self.table).where(family_rows(self.table, roots)))
        return [tuple(row) for row in result]

    def family_count(self, conn: Connection, *, roots: Sequence[int]) -> int:
        """How many rows the families ``roots`` have."""
        counted = 0
        for start in range(0, len(roots), IDS_PER_STATEMENT):
            batch = roots[start : start + IDS_PER_STATEMENT]
            statement = select(func.count()).select_from(self.table)
            counted += conn.execute(statement.where(family_rows(self.table, batch))).scalar_one()
        return counted

    def delete_closed(self, conn: Connection, *, ids: Sequence[int]) -> int:
        """Delete the rows ``ids`` that are not open (a row that is stays);
        how many were deleted."""
        deleted = 0
        for start in range(0, len(ids), IDS_PER_STATEMENT):
            batch = list(ids[start : start + IDS_PER_STATEMENT])
            deleted += conn.execute(self._delete_closed, {"ids": batch}).rowcount
        return deleted
