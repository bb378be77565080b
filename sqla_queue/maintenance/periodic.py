"""Periodic tasks of the application: a worker class declares them, the
fleet enqueues each due occurrence exactly once.

    from sqla_queue import Periodic, WorkerBase

    class Billing(WorkerBase):
        model = Task
        periodic = (
            Periodic("nightly-invoices", "0 3 * * *", process="faturar",
                     payload={"kind": "nightly"}),
            Periodic("sync", "0,15,30,45", process="sincronizar"),   # the seed's minute list
            Periodic("heartbeat", "@every 30s", process="ping"),
        )

A schedule is one of the forms of the maintenance routines
(``maintenance/timing.py``): a cron string, the seed's minute list or
``@every N(s|m|h)``, evaluated in UTC. Each occurrence becomes one task of
``process`` with ``payload``, ``data_hora`` = the occurrence's time and
``chave_externa`` = ``periodic:NAME`` (unless ``external_key`` is given).

Who enqueues: every worker process of the class runs the ``periodic``
routine once a second, under the routine lock, leaderless. What makes an
occurrence enqueued exactly once is the database, not the lock: the last
occurrence enqueued of each name is kept in the queue's configuration table
(``setting_name = 'periodic_runs'``, one JSON object per queue), read with
``FOR UPDATE`` (SQLite: the write lock) and written in the transaction that
inserts the task, which only happens when the stored occurrence is older.

Missed occurrences (every worker was down): only the latest is enqueued,
once, when a worker is back; the ones before it are skipped (as Celery
beat and Oban's cron do). A name seen for the first time starts from the
current occurrence without enqueueing it: deploying a daily task at 10:00
does not run the 03:00 one. Removing a declaration leaves its entry in the
JSON, harmlessly; renaming one starts it afresh.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Table, inspect

from ..adapters.base import Adapter
from ..client.queue import QueueClient
from ..common.exceptions import ConfigurationError
from ..common.payload import serialize_payload
from ..config.timing import Every, Schedule, parse_schedule
from ..schema.configuration_table import ensure_table, has_queue_name
from .base import Routine, RoutineResult
from .clock import Clock

__all__ = [
    "PERIODIC_SETTING",
    "Periodic",
    "PeriodicRoutine",
    "check_periodic",
    "last_runs",
    "next_runs",
]

#: the configuration table's row holding the last occurrence of each name
PERIODIC_SETTING = "periodic_runs"
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


@dataclass(frozen=True)
class Periodic:
    """One periodic task (see the module)."""

    name: str
    schedule: str
    process: str
    payload: Any = None
    priority: int | None = None
    external_key: str | None = None
    #: the parsed schedule
    parsed: Schedule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"Periodic name {self.name!r}: 1 to 100 letters, digits, '_', '.', ':' or '-'"
            )
        if not isinstance(self.process, str) or not self.process or len(self.process) > 250:
            raise ConfigurationError(
                f"Periodic {self.name}: process must be a processo value (1-250 characters)"
            )
        parsed = parse_schedule(self.schedule, f"Periodic {self.name} schedule")
        serialize_payload(self.payload)  # a payload that is not JSON fails here, not at 03:00
        object.__setattr__(self, "parsed", parsed)

    @property
    def key(self) -> str:
        return self.external_key or f"periodic:{self.name}"


def check_periodic(declared: object, owner: str) -> tuple[Periodic, ...]:
    """A worker class's ``periodic``: a sequence of :class:`Periodic` with
    distinct names, or one ConfigurationError naming ``owner``."""
    if declared is None:
        return ()
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable):
        raise ConfigurationError(f"{owner}.periodic must be a list of Periodic, not {declared!r}")
    items = tuple(declared)
    for item in items:
        if not isinstance(item, Periodic):
            raise ConfigurationError(f"{owner}.periodic must hold Periodic objects, not {item!r}")
    names = [item.name for item in items]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigurationError(f"{owner}.periodic names {', '.join(twice)} more than once")
    return items


# ------------------------------------------------------------- the markers
def _queue_of(conn: Connection, table: Table, queue: str) -> str | None:
    """The marker row's ``queue_name``: None where the table has none."""
    return queue if has_queue_name(conn, table) else None


#: the key of the stored value that lists the names whose stored occurrence
#: was only seen (first sight), not enqueued: status shows no last run there
STARTED_KEY = "#started"  # "#": not a character a name may hold


def _decode(value: str | None) -> tuple[dict[str, dt.datetime], set[str]]:
    """(occurrence dealt with, by name; the names whose occurrence was only
    seen). A value written before the started list: every name enqueued."""
    try:
        raw = json.loads(value or "{}")
    except ValueError:
        return {}, set()
    raw = raw if isinstance(raw, dict) else {}
    started = raw.pop(STARTED_KEY, [])
    runs = {}
    for name, text in raw.items():
        try:
            runs[str(name)] = dt.datetime.fromisoformat(str(text))
        except ValueError:
            continue
    if not isinstance(started, list):
        return runs, set()
    return runs, {str(name) for name in started if str(name) in runs}


def _encode(runs: dict[str, dt.datetime], started: set[str]) -> str:
    value: dict[str, Any] = {name: when.isoformat() for name, when in sorted(runs.items())}
    if started:
        value[STARTED_KEY] = sorted(started)
    return json.dumps(value)


def last_runs(conn: Connection, adapter: Adapter, table: Table) -> dict[str, dt.datetime]:
    """The last occurrence enqueued of each name, of ``adapter``'s queue,
    kept in configuration table ``table`` (a name whose occurrences were
    only seen, at first sight, has none)."""
    if not inspect(conn).has_table(table.name, schema=table.schema):
        return {}
    queue = _queue_of(conn, table, adapter.table.name)
    runs, started = _decode(adapter.settings(table).value(conn, name=PERIODIC_SETTING, queue=queue))
    return {name: when for name, when in runs.items() if name not in started}


def locked_runs(
    conn: Connection, adapter: Adapter, table: Table
) -> tuple[dict[str, dt.datetime], set[str], str | None]:
    """The stored occurrences and the names only started (:func:`_decode`),
    the row locked until the caller's transaction ends (created empty first
    if missing); and the row's ``queue_name``."""
    queue = _queue_of(conn, table, adapter.table.name)
    rows = adapter.settings(table)
    for _ in range(2):  # a concurrent first run inserts the row: then lock it
        row = rows.value_locked(conn, name=PERIODIC_SETTING, queue=queue)
        if row is not None:
            return (*_decode(row[0]), queue)
        values = {
            "setting_name": PERIODIC_SETTING,
            "value": "{}",
            "casted_as": "JSON",
            "unit": None,
            "note": "last occurrence enqueued of each periodic task (sqla-queue)",
        }
        if queue is not None:
            values["queue_name"] = queue
        rows.row_insert(conn, row=values)
    raise ConfigurationError("the periodic_runs row could not be read: try again")


def store_runs(
    conn: Connection,
    adapter: Adapter,
    table: Table,
    queue: str | None,
    runs: dict[str, dt.datetime],
    started: set[str],
) -> None:
    value = _encode(runs, started)
    adapter.settings(table).value_set(conn, name=PERIODIC_SETTING, queue=queue, value=value)


def next_runs(
    declared: Sequence[Periodic], stored: dict[str, dt.datetime], now: dt.datetime
) -> list[dict[str, Any]]:
    """For ``status``: each periodic task with its last and next occurrence."""
    return [
        {
            "name": item.name,
            "schedule": item.parsed.describe(),
            "process": item.process,
            "last_enqueued": _iso(stored.get(item.name)),
            "next_run": _iso(item.parsed.next_after(now)),
        }
        for item in declared
    ]


def _iso(when: dt.datetime | None) -> str | None:
    return None if when is None else when.astimezone(dt.timezone.utc).isoformat()


# ------------------------------------------------------------- the routine
class PeriodicRoutine(Routine):
    """Enqueues the due occurrences of a worker class's periodic tasks."""

    name = "periodic"

    def __init__(
        self,
        engine: Engine,
        adapter: Any,
        declared: Sequence[Periodic],
        markers: Table,
        *,
        schedule: Schedule | None = None,
        wake: Any = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(engine, adapter, schedule or Every(1.0), clock=clock)
        self.declared = tuple(declared)
        self.markers = markers
        self.wake = wake
        #: the newest occurrence of each name known to be dealt with (by any
        #: worker): the database is read only when a newer one is due
        self._known: dict[str, dt.datetime] = {}
        self._table_checked = False

    def due(self, now: dt.datetime) -> dict[str, dt.datetime]:
        """The names whose current occurrence this process has not seen dealt with."""
        due = {}
        for item in self.declared:
            occurrence = item.parsed.slot_at(now)
            known = self._known.get(item.name)
            if known is None or occurrence > known:
                due[item.name] = occurrence
        return due

    def _round(self, dry_run: bool) -> RoutineResult:
        due = self.due(self.clock.now())
        if not due:
            return RoutineResult(self.name, {"enqueued": 0})
        if not self._table_checked:
            ensure_table(self.engine, self.markers)  # DDL: outside the transaction
            self._table_checked = True
        by_name = {item.name: item for item in self.declared}
        enqueued = first_seen = 0
        with self.adapter.connect_maintenance(self.engine) as conn:
            transaction = conn.begin()
            try:
                stored, started, scope = locked_runs(conn, self.adapter, self.markers)
                for name, occurrence in due.items():
                    last = stored.get(name)
                    if last is not None and last >= occurrence:
                        self._known[name] = last  # another worker did it
                        continue
                    if last is None:
                        first_seen += 1  # starts from now: nothing enqueued
                        started.add(name)
                    else:
                        self._enqueue(conn, by_name[name], occurrence)
                        enqueued += 1
                        started.discard(name)
                    stored[name] = occurrence
                if dry_run:
                    transaction.rollback()
                else:
                    store_runs(conn, self.adapter, self.markers, scope, stored, started)
                    transaction.commit()
                    for name, occurrence in due.items():
                        self._known[name] = max(occurrence, stored[name])
            except BaseException:
                if transaction.is_active:
                    transaction.rollback()
                raise
        if enqueued and not dry_run and self.wake is not None:
            self.wake()
        counts = {"enqueued": enqueued, "started": first_seen}
        return RoutineResult(self.name, counts, dry_run=dry_run)

    def _enqueue(self, conn: Connection, item: Periodic, occurrence: dt.datetime) -> int:
        return QueueClient(conn, self.adapter.table).insert_task(
            processo=item.process,
            chave_externa=item.key,
            payload=item.payload,
            data_hora=occurrence,
            prioridade=item.priority,
        )
