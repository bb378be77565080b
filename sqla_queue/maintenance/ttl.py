"""TTL (PEQ's ``item_ttl``): a task pending too long goes to the dead letter.

A ``pendente`` row whose time came more than ``item_ttl`` minutes ago (no
worker took it: none runs its process, or the queue is far behind) becomes
``falha`` with ``estouro_tentativas`` and a message that says why, and its
dead-letter run is enqueued with its payload, as after the last attempt. A
dead-letter run that expires is only marked: nothing follows it. Off by
default (the seed had no TTL; PEQ's default is 4320 minutes, three days).

Rows are taken ``FOR UPDATE SKIP LOCKED`` where the database can, and each
update is guarded by ``status = 'pendente'``: a task a worker claims
meanwhile is left to it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from ..adapters import Adapter
from ..common.redaction import fit_message
from ..config.ranges import ITEM_TTL_MINUTES, Range
from ..config.timing import Schedule
from ..schema.mixins import MESSAGE_MAX_LENGTH, Status
from ..schema.rows import dead_letter_row
from .base import Routine, RoutineResult
from .clock import Clock

__all__ = ["TtlConfig", "TtlRoutine", "expiry_gloss"]

TTL_CHUNK = Range(1, 100_000, integer=True)


@dataclass(frozen=True)
class TtlConfig:
    #: minutes a task may stay pendente after its time; 0: no TTL
    ttl_minutes: float = 0.0
    #: rows expired per transaction
    chunk: int = 1000
    #: transactions per round at most
    max_chunks: int = 100

    def __post_init__(self) -> None:
        ITEM_TTL_MINUTES.check("item_ttl", self.ttl_minutes)
        TTL_CHUNK.check("ttl chunk", self.chunk)
        TTL_CHUNK.check("ttl max_chunks", self.max_chunks)

    def message(self, dead: bool) -> str:
        head = f"Tarefa expirada: pendente há mais de {self.ttl_minutes:g} minutos (item_ttl)."
        return fit_message(head + (_DEAD_TAIL if dead else _LIVE_TAIL), MESSAGE_MAX_LENGTH)


_DEAD_TAIL = " Fila de mortos: sem nova execução."
_LIVE_TAIL = " Enviada à fila de mortos."
_EXPIRED = re.compile(
    r"Tarefa expirada: pendente há mais de (?P<minutes>\S+) minutos \(item_ttl\)\.(?P<tail>.*)",
    re.DOTALL,
)
_TAIL_GLOSSES = {
    _DEAD_TAIL: "; a dead-letter run: none follows",
    _LIVE_TAIL: "; sent to the dead letter",
    "": "",
}


def expiry_gloss(message: str) -> str | None:
    """:meth:`TtlConfig.message`'s text in English, for a person (None:
    not that text)."""
    found = _EXPIRED.fullmatch(message)
    if found is None or found["tail"] not in _TAIL_GLOSSES:
        return None
    head = f"expired: ready for more than {found['minutes']} minutes (item_ttl)"
    return head + _TAIL_GLOSSES[found["tail"]]


class TtlRoutine(Routine):
    name = "ttl"

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        schedule: Schedule,
        config: TtlConfig | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(engine, adapter, schedule, clock=clock)
        self.config = config or TtlConfig()

    def _round(self, dry_run: bool) -> RoutineResult:
        config = self.config
        if not config.ttl_minutes:
            return RoutineResult(self.name, {"expired": 0}, dry_run=dry_run)
        before = self.clock.now() - dt.timedelta(minutes=config.ttl_minutes)
        expired = dead_letters = 0
        with self.adapter.connect_maintenance(self.engine) as conn:
            for _ in range(config.max_chunks):
                with conn.begin() as transaction:
                    ids = self.queries.pending_expired_ids(conn, before=before, limit=config.chunk)
                    if dry_run:
                        expired = len(ids)
                        transaction.rollback()
                        break
                    done, rows = self._expire(conn, ids)
                    self.adapter.task_insert_many(conn, rows=rows)
                expired += done
                dead_letters += len(rows)
                self._advanced(expired, {"expired": expired, "dead_letters": dead_letters})
                if len(ids) < config.chunk:
                    break
        counts = {"expired": expired}
        if not dry_run:
            counts["dead_letters"] = dead_letters
        return RoutineResult(self.name, counts, dry_run=dry_run)

    def _expire(self, conn: Connection, ids: list[int]) -> tuple[int, list[dict[str, Any]]]:
        """Fail each still-pendente row; the dead-letter rows to insert."""
        if not ids:
            return 0, []
        done = 0
        rows = []
        for task in self.adapter._fetch_records(conn, self.adapter._rows_by_id, {"ids": ids}):
            message = self.config.message(task.dead)
            if self.queries.pending_fail(
                conn, task_id=task.id, status=Status.FAILED.value, message=message
            ):
                done += 1
                if not task.dead:
                    rows.append(dead_letter_row(task))
        return done, rows
