"""The statements an operator's actions run (cancel, retry now), beside
the adapter they extend. Portable Core; each changes only rows still in the
state it expects, so a worker's claim and an action never both win: on
PostgreSQL and MySQL the row lock orders them and the loser's condition no
longer holds; SQLite has one writer at a time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Connection, bindparam, false, select, update

from ..common.types import UtcDateTime
from ..schema.mixins import Status, inline_count, status_is

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["ActionQueries"]

_WAITING = (Status.PENDING, Status.SCHEDULED)


class ActionQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        table = adapter.table
        c = table.c
        key = bindparam("key", type_=BigInteger)
        # one statement per index (an OR of the two reads the whole table)
        self._waiting_of_chain = [
            select(c.id).where(column == key, status_is(c.status, *_WAITING))
            for column in (c.id, c.id_inicial)
        ]
        # by one id (a list of them, with both statuses, makes PostgreSQL's
        # generic plan read the whole table)
        self._cancel = (
            update(table)
            .where(c.id == bindparam("b_id"), status_is(c.status, *_WAITING))
            .values(
                status=Status.FAILED.value,
                estouro_tentativas=False,
                reenfileirado=False,
                mensagem=bindparam("b_message"),
                finished_at=adapter.clock(),
            )
        )
        before = bindparam("before", type_=UtcDateTime())
        limit = inline_count()
        self._waiting_of_process = [
            select(c.id)
            .where(
                status_is(c.status, status),
                c.processo == bindparam("process"),
                c.dead == false(),
                c.data_hora_inicial < before,
            )
            .limit(limit)  # no ORDER BY: SQLite would walk the rowid in order instead of the index
            for status in _WAITING
        ]
        self._run_now = (
            update(table)
            .where(c.id == bindparam("task_id"), status_is(c.status, Status.SCHEDULED))
            .values(status=Status.PENDING.value, data_hora=adapter.clock())
        )

    def waiting_of_chain(self, conn: Connection, *, key: int) -> list[int]:
        """The attempts of the chain ``key`` that wait (pendente, agendada)."""
        found: list[int] = []
        for statement in self._waiting_of_chain:
            found += conn.execute(statement, {"key": key}).scalars()
        return sorted(set(found))

    def waiting_of_process(
        self, conn: Connection, *, process: str, before: dt.datetime, limit: int
    ) -> list[int]:
        """Up to ``limit`` waiting attempts of ``process`` (not dead-letter
        runs) whose task was first enqueued before ``before``."""
        found: list[int] = []
        for statement in self._waiting_of_process:
            params = {"process": process, "before": before, "limit": limit - len(found)}
            found += conn.execute(statement, params).scalars()
            if len(found) >= limit:
                break
        return found

    def cancel(self, conn: Connection, *, ids: Sequence[int], message: str) -> int:
        """Mark the waiting attempts among ``ids`` cancelled; how many were."""
        done = 0
        for task_id in ids:
            done += conn.execute(self._cancel, {"b_id": task_id, "b_message": message}).rowcount
        return done

    def run_now(self, conn: Connection, *, task_id: int) -> bool:
        """Make the scheduled attempt ``task_id`` ready now."""
        return bool(conn.execute(self._run_now, {"task_id": task_id}).rowcount)
