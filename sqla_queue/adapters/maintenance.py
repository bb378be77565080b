"""The maintenance routines' statements, beside the adapter they extend.

Portable SQLAlchemy Core, compiled once per queue table; the adapter gives
what differs by dialect (its id matching and chunking, its index hints,
whether the database can ``SKIP LOCKED``). Times are bound from the
routine's clock, so a test can move it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, delete, select, update

from ..common.identifiers import derived_identifier
from ..common.types import UtcDateTime
from ..schema.mixins import CLOSED_STATUSES, OPEN_STATUSES, Status, inline_count, status_is

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["CLOSED_STATUSES", "OPEN_STATUSES", "FamilyRow", "MaintenanceQueries"]

#: (id, id_inicial, dead, live_id, status, data_hora) of a row of a family
FamilyRow = tuple[int, int | None, bool, int | None, str | None, dt.datetime | None]


def family_key(row: FamilyRow) -> int:
    """The family a row belongs to: the first attempt's id of the task it
    is part of. A dead-letter run's rows carry it as ``live_id``, and so do
    the rows of a chain requeued from that run (requeue.py): the requeued
    chain stays with the dead-letter run that says it was requeued, so the
    purge never deletes one without the other (else the dead task could be
    requeued again)."""
    task_id, initial_id, live_id = row[0], row[1], row[3]
    if live_id is not None:
        return live_id
    return initial_id or task_id


class MaintenanceQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        table = adapter.table
        c = table.c
        self.skip_locked = adapter.skip_locked
        before = bindparam("before", type_=UtcDateTime())
        limit = inline_count()
        self._stale_pending = (
            select(c.id).where(status_is(c.status, Status.PENDING), c.data_hora <= before).limit(1)
        )
        expired = (
            select(c.id)
            .where(status_is(c.status, Status.PENDING), c.data_hora <= before)
            .order_by(c.data_hora, c.id)
            .limit(limit)
        )
        self._expired = expired.with_for_update(skip_locked=True) if self.skip_locked else expired
        self._fail_pending = (
            update(table)
            .where(c.id == bindparam("b_id"), status_is(c.status, Status.PENDING))
            .values(
                status=bindparam("b_status"),
                estouro_tentativas=True,
                mensagem=bindparam("b_message"),
            )
        )
        # oldest first by id: the primary key's order, which follows the
        # insertion order that data_hora mostly follows too (a range scan
        # instead of sorting every old row of the table in each chunk)
        self._purge_scan = (
            select(c.id, c.id_inicial, c.dead, c.live_id)
            .where(
                c.id > bindparam("after"),
                c.data_hora < before,
                status_is(c.status, *CLOSED_STATUSES),
            )
            .order_by(c.id)
            .limit(limit)
        )
        family_columns = (c.id, c.id_inicial, c.dead, c.live_id, c.status, c.data_hora)
        self._family = [
            adapter.force_index(
                select(*family_columns).where(adapter.id_match(column, "keys")), index
            )
            for column, index in (
                (c.id, "PRIMARY"),
                (c.id_inicial, derived_identifier(table.name, "inicial", "ix_")),
                (c.live_id, derived_identifier(table.name, "live", "ix_")),
            )
        ]
        self._delete = delete(table).where(
            adapter.id_match(c.id, "ids"), status_is(c.status, *CLOSED_STATUSES)
        )

    # ------------------------------------------------------------ schedule
    def pending_stale_exists(self, conn: Connection, *, before: dt.datetime) -> bool:
        return conn.execute(self._stale_pending, {"before": before}).first() is not None

    # ------------------------------------------------------------ ttl
    def pending_expired_ids(
        self, conn: Connection, *, before: dt.datetime, limit: int
    ) -> list[int]:
        """``pendente`` rows due before ``before``, oldest first, locked
        (skipping rows a claim holds) where the database can."""
        return list(conn.execute(self._expired, {"before": before, "limit": limit}).scalars())

    def pending_fail(self, conn: Connection, *, task_id: int, status: str, message: str) -> bool:
        """Mark one row failed if it is still ``pendente``; whether it was."""
        params = {"b_id": task_id, "b_status": status, "b_message": message}
        return bool(conn.execute(self._fail_pending, params).rowcount)

    # ------------------------------------------------------------ purge
    def purge_scan(
        self, conn: Connection, *, after: int, before: dt.datetime, limit: int
    ) -> list[tuple[int, int | None, bool, int | None]]:
        params = {"after": after, "before": before, "limit": limit}
        rows = conn.execute(self._purge_scan, params).all()
        return [(row[0], row[1], bool(row[2]), row[3]) for row in rows]

    def family_rows(self, conn: Connection, *, keys: Sequence[int]) -> list[FamilyRow]:
        """Every row of the chains ``keys`` (their attempts and dead-letter
        runs), each once. Three index look-ups rather than one ``OR``,
        which not every planner turns into a union."""
        seen: dict[int, FamilyRow] = {}
        for statement in self._family:
            for chunk in self.adapter.id_chunks(keys):
                rows = conn.execute(statement, {"keys": chunk}).all()
                self._family_into(seen, rows, conn)
        return list(seen.values())

    @staticmethod
    def _family_into(seen: dict[int, FamilyRow], rows: Sequence[Any], conn: Connection) -> None:
        for row in rows:
            value: Any = row
            seen[row[0]] = (
                value[0],
                value[1],
                bool(value[2]),
                value[3],
                value[4],
                UtcDateTime().process_result_value(value[5], conn.dialect),
            )

    def delete_ids(self, conn: Connection, *, ids: Sequence[int]) -> int:
        """Delete closed rows by id (a row that is not closed stays)."""
        return sum(
            int(conn.execute(self._delete, {"ids": chunk}).rowcount)
            for chunk in self.adapter.id_chunks(ids)
        )
