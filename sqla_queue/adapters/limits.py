"""The statements of fleet-wide concurrency and rate limits
(``sqla_queue/limits.py``), beside the adapters: how many tasks of a
process are running now, the database's clock, and the rate limits' token
buckets in the configuration table."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table, bindparam, func, insert, select, update

from ..mixins import Status, status_is

if TYPE_CHECKING:
    from .base import Adapter

__all__ = ["LimitQueries", "RateBuckets"]


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
        self._clock = adapter.clock()
        self.queue = adapter.table.name

    def now(self, conn: Connection) -> dt.datetime:
        """The database's clock (the fleet's one clock for rate limits), in UTC."""
        now: dt.datetime = conn.execute(select(self._clock)).scalar_one()
        return now if now.tzinfo is not None else now.replace(tzinfo=dt.timezone.utc)

    def running(self, conn: Connection, process: str) -> int:
        """Tasks of ``process`` claimed and not finished (``processando``),
        by every worker of the queue."""
        return int(conn.execute(self._running, {"process": process}).scalar_one())


class RateBuckets:
    """A token bucket per rate-limited subject of a queue (a process, or a
    key of a fair worker's column: ``sqla_queue/fairness.py``), kept in a
    row of the queue's configuration table (``setting_name`` ``rate:<hash
    of queue and subject>``, ``value`` ``<tokens> <as of, epoch
    seconds>``), read with a locking read and written in the claim's
    transaction."""

    def __init__(
        self,
        settings: Table,
        queue: str,
        *,
        scoped: bool | None = None,
        prepare: Callable[[], bool] | None = None,
    ) -> None:
        """``scoped``: whether the table has ``queue_name``; unknown (None),
        ``prepare()`` makes the table if missing and says, before the first
        use (:meth:`ready`)."""
        self.settings = settings
        self.queue = queue
        self.scoped = scoped
        self._prepare = prepare

    def ready(self) -> bool:
        """Whether the table has ``queue_name``, the table made first if
        missing (on another connection than the claim's: DDL ends a
        MariaDB transaction)."""
        if self.scoped is None:
            if self._prepare is None:
                raise RuntimeError("RateBuckets needs scoped or prepare")
            self.scoped = self._prepare()
        return self.scoped

    def _where(self, subject: str) -> list[Any]:
        c = self.settings.c
        where = [c.setting_name == self.name(subject)]
        if self.ready():
            where.append(c.queue_name == self.queue)
        return where

    def name(self, subject: str) -> str:
        digest = hashlib.sha256(f"{self.queue}\0{subject}".encode()).hexdigest()[:40]
        return f"rate:{digest}"

    def read(self, conn: Connection, subject: str) -> tuple[float, float] | None:
        """(tokens, as of) of ``subject``'s bucket, locked; None: no row yet."""
        found = conn.execute(
            select(self.settings.c.value).where(*self._where(subject)).with_for_update()
        ).first()
        if found is None:
            return None
        try:
            tokens, at = (float(part) for part in str(found[0]).split())
        except ValueError:
            return 0.0, 0.0  # edited by hand: refilled from empty
        return tokens, at

    def write(
        self, conn: Connection, subject: str, tokens: float, at: float, *, exists: bool, note: str
    ) -> None:
        """Store the bucket; ``note`` (the row's note when it is made) says
        whose bucket it is."""
        value = f"{tokens:.6f} {at:.6f}"
        if exists:
            conn.execute(update(self.settings).where(*self._where(subject)).values(value=value))
            return
        row = {
            "setting_name": self.name(subject),
            "value": value,
            "unit": None,
            "casted_as": "TEXT",
            "note": note,
        }
        if self.ready():
            row["queue_name"] = self.queue
        conn.execute(insert(self.settings).values(**row))
