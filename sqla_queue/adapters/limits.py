"""The statement of fleet-wide concurrency limits (``sqla_queue/limits.py``),
beside the adapters: how many tasks of a process are running now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection, bindparam, func, select

from ..mixins import Status, status_is

if TYPE_CHECKING:
    from .base import Adapter

__all__ = ["LimitQueries"]


class LimitQueries:
    def __init__(self, adapter: Adapter) -> None:
        c = adapter.table.c
        # the running rows' index (ix_processando, partial; the status
        # indexes on the MySQL family): its cost follows the running tasks
        self._running = (
            select(func.count())
            .select_from(adapter.table)
            .where(status_is(c.status, Status.PROCESSING), c.processo == bindparam("process"))
        )

    def running(self, conn: Connection, process: str) -> int:
        """Tasks of ``process`` claimed and not finished (``processando``),
        by every worker of the queue."""
        return int(conn.execute(self._running, {"process": process}).scalar_one())
