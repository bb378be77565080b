"""The statements of fleet-wide concurrency and rate limits
(``sqla_queue/policies/limits.py``), beside the adapters: how many tasks of a
process are running now, the database's clock, and the rate limits' token
buckets in the configuration table."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table, bindparam, delete, func, insert, inspect, select, update
from sqlalchemy.sql.elements import ColumnElement

from ..schema.mixins import Status, status_is

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["FORGET_LIMIT", "LimitQueries", "RateBuckets"]


class LimitQueries:
    def __init__(self, adapter: PartOwner) -> None:
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
    key of a fair worker's column: ``sqla_queue/policies/fairness.py``), kept in a
    row of the queue's configuration table (``setting_name`` ``rate:<hash
    of queue and subject>``, ``value`` ``<tokens> <as of, epoch
    seconds>``, ``unit`` ``<tokens a second>/s``), read with a locking read
    and written in the claim's transaction. A bucket full by now is what
    no row means: the purge deletes those (:meth:`forget_full`), so a key
    seen once does not keep a row forever."""

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
        return [self.settings.c.setting_name == self.name(subject), *self._scope()]

    def _scope(self) -> list[ColumnElement[bool]]:
        """This queue's rows (none to name on a table without ``queue_name``)."""
        return [self.settings.c.queue_name == self.queue] if self.ready() else []

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
        self,
        conn: Connection,
        subject: str,
        tokens: float,
        at: float,
        *,
        rate: float,
        exists: bool,
        note: str,
    ) -> None:
        """Store the bucket (refilled at ``rate`` tokens a second); ``note``
        (the row's note when it is made) says whose bucket it is."""
        value, unit = f"{tokens:.6f} {at:.6f}", f"{rate:.12g}{_PER_SECOND}"
        if exists:
            conn.execute(
                update(self.settings).where(*self._where(subject)).values(value=value, unit=unit)
            )
            return
        row = {
            "setting_name": self.name(subject),
            "value": value,
            "unit": unit,
            "casted_as": "TEXT",
            "note": note,
        }
        if self.ready():
            row["queue_name"] = self.queue
        conn.execute(insert(self.settings).values(**row))

    def forget_full(
        self, conn: Connection, now: float, *, after: str = "", dry_run: bool = False
    ) -> tuple[int, str | None]:
        """Delete this queue's buckets that are full by ``now`` (the
        database's clock, epoch seconds) among the next ``FORGET_LIMIT``
        rows by name from ``after``, in the caller's transaction; how many
        (would be, with ``dry_run``), and the name to go on after (None:
        the last page).

        Full is what a missing row means to the claim (``limits.py``), with
        a second's margin. A row is deleted only with the value read here:
        a bucket written meanwhile (a claim took tokens) stays. Rows without
        a rate (written before it was kept, or by hand) stay too."""
        if not inspect(conn).has_table(self.settings.name, schema=self.settings.schema):
            return 0, None
        c = self.settings.c
        scope = self._scope()
        rows = conn.execute(
            select(c.setting_name, c.value, c.unit)
            .where(
                c.setting_name.like("rate:%"),
                c.unit.like(f"%{_PER_SECOND}"),
                c.setting_name > after,
                *scope,
            )
            .order_by(c.setting_name)
            .limit(FORGET_LIMIT)
        ).all()
        full = [(name, value) for name, value, unit in rows if _full(value, unit, now)]
        if full and not dry_run:
            delete_one = delete(self.settings).where(
                c.setting_name == bindparam("name"), c.value == bindparam("value"), *scope
            )
            conn.execute(delete_one, [{"name": name, "value": value} for name, value in full])
        return len(full), (rows[-1][0] if len(rows) == FORGET_LIMIT else None)


#: buckets :meth:`RateBuckets.forget_full` looks at in one call (one transaction)
FORGET_LIMIT = 1_000
_PER_SECOND = "/s"


def _full(value: str | None, unit: str | None, now: float) -> bool:
    """Whether a bucket row (``value``, ``unit``) is full by ``now``, a
    second's margin beyond (see ``limits.claim_within_rate``: up to a
    second's worth of tokens, at least one)."""
    try:
        tokens, at = (float(part) for part in str(value).split())
        rate = float(str(unit).removesuffix(_PER_SECOND))
    except ValueError:
        return False
    if not rate > 0:
        return False
    return tokens + (now - at - 1.0) * rate >= max(1.0, rate)
