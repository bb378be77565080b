"""The statements of per-key fairness (sqla_queue/policies/fairness.py): which keys
have ready tasks, and how many tasks of a key are running.

The keys are found by skipping through ``ix_<table>_justo_<column>`` from
one key to the next (a recursive query: the smallest key above the last
one, again and again), so a key with 100,000 ready rows costs one index
probe like a key with one. The recursion stops after ``limit`` keys on
every dialect (MariaDB and SQLite would otherwise walk every key before
the outer LIMIT applies). NULL is no key here; the fair claim asks for
rows with no key apart.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Integer, Table, bindparam, exists, func, literal, select

from ..schema.mixins import Status, status_is

__all__ = ["FairnessQueries"]


class FairnessQueries:
    """The key look-ups of one queue table's column ``column``."""

    def __init__(self, table: Table, column: str) -> None:
        self.column = column
        c = table.c
        key = c[column]
        pending = status_is(c.status, Status.PENDING)
        first = select(func.min(key).label("k"), literal(1, Integer).label("n")).where(
            pending, key > bindparam("after", type_=key.type)
        )
        keys = first.cte("fair_keys", recursive=True)
        following = select(func.min(key)).where(pending, key > keys.c.k).scalar_subquery()
        keys = keys.union_all(
            select(following, keys.c.n + 1).where(
                keys.c.k.is_not(None), keys.c.n < bindparam("limit", type_=Integer)
            )
        )
        self._after = select(keys.c.k).where(keys.c.k.is_not(None))
        # the running rows' index (ix_processando; the status indexes on the
        # MySQL family): its cost follows the running tasks, not the table
        self._running = (
            select(func.count())
            .select_from(table)
            .where(status_is(c.status, Status.PROCESSING), key == bindparam("key", type_=key.type))
        )
        smallest = select(func.min(key)).where(pending).scalar_subquery()
        self._smallest = select(smallest)
        self._unkeyed = select(exists().where(pending, key.is_(None)))

    def keys(self, conn: Connection, *, after: Any, limit: int) -> list[Any]:
        """Up to ``limit`` keys with ready (``pendente``) rows, in order,
        from the first one above ``after`` (None: from the smallest), and
        on from the smallest when the largest is passed (round robin: the
        key ``after`` itself comes last)."""
        found: list[Any] = []
        if after is not None:
            found += conn.execute(self._after, {"after": after, "limit": limit}).scalars()
        if len(found) < limit:
            for key in self._from_smallest(conn, limit - len(found)):
                if after is not None and key > after:
                    break  # found above already
                found.append(key)
        return found[:limit]

    def _from_smallest(self, conn: Connection, limit: int) -> list[Any]:
        first = conn.execute(self._smallest).scalar()
        if first is None:
            return []
        found = [first]
        if limit > 1:
            found += conn.execute(self._after, {"after": first, "limit": limit - 1}).scalars()
        return found

    def running(self, conn: Connection, key: Any) -> int:
        """Tasks of ``key`` claimed and not finished, by every worker."""
        return int(conn.execute(self._running, {"key": key}).scalar_one())

    def unkeyed(self, conn: Connection) -> bool:
        """Whether rows whose key is NULL are ready."""
        return bool(conn.execute(self._unkeyed).scalar())
