"""Requeue from the dead letter: a dead task runs again, as a new chain.

A task is *dead* when its chain ended in the dead letter: a dead-letter run
(a row with ``dead`` true and ``id_inicial`` NULL, its *head*) exists for
it. Requeueing inserts a new first attempt (``pendente``, attempt 1) with
the dead task's payload, process, keys, tenant and priority, linked to the
old chain: ``id_anterior`` (and ``data_hora_anterior``, ``status_anterior``,
``mensagem_anterior``) name the dead-letter head, and ``live_id`` the
original chain, as on the dead-letter rows. Each head is requeued once:
the heads are locked (``FOR UPDATE``; on SQLite, which has no row locks,
the database's write lock is taken first) and a head that already has a
requeued chain is skipped, so two requeues at once revive a task once, on
any engine (the application's own too).

A dead task of a unique process (``__queue_unique__``, docs/unique.md)
whose key a live task holds now (or, with a period, a task that succeeded
within it) is not requeued: the call raises ``DuplicateTaskError`` naming
both, before it inserts anything (roll the transaction back: the key table
may have been written), as it does for two dead tasks of one key in one
call. A requeued chain takes its key, as an enqueue does. The table's
live-key index (unique.py) refuses what this check cannot see (a table
named without its model).

Selection: by ids (a head's id or the original task's, ``live_id``), by
process, by the head's time (``data_hora``: when the task went dead), or
all; ``dry_run`` lists what would be requeued and writes nothing. It runs
in the caller's transaction (``QueueClient.requeue_dead``) or in its own
(``sqla-queue requeue``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from ..adapters import Adapter
from ..common.exceptions import ConfigurationError, DuplicateTaskError
from ..common.progress import Progress
from ..common.types import utcnow
from ..enqueue import unique
from ..schema.mixins import Status
from ..schema.records import TaskRecord
from ..schema.rows import carried_columns
from .workflow import resume_steps

__all__ = ["Requeued", "requeue_dead"]

#: heads requeued per call at most (call again for more)
MAX_REQUEUE = 10_000
#: rows per insert of a requeue (its progress is reported after each)
REQUEUE_CHUNK = 1_000


@dataclass(frozen=True)
class Requeued:
    #: the dead-letter run's first row
    dead_id: int
    #: the original task's first attempt (the chain that went dead)
    live_id: int | None
    process: str | None
    #: the new chain's first attempt; None in a dry run
    new_id: int | None


def requeue_dead(
    conn: Connection,
    adapter: Adapter,
    *,
    ids: Iterable[int] | None = None,
    process: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    all_dead: bool = False,
    limit: int = MAX_REQUEUE,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> list[Requeued]:
    """Requeue the dead tasks that match, on ``conn`` (no commit);
    ``progress`` is told after each chunk of :data:`REQUEUE_CHUNK`."""
    id_list = None if ids is None else sorted({int(i) for i in ids})
    if id_list is None and process is None and since is None and until is None and not all_dead:
        raise ConfigurationError("requeue_dead needs ids, a process, a time range, or all_dead")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_REQUEUE:
        raise ConfigurationError(f"limit must be a whole number from 1 to {MAX_REQUEUE}")
    if not dry_run:
        adapter.lock_writers(conn)  # SQLite: the heads' FOR UPDATE does nothing
    found = adapter.task_dead_heads(
        conn,
        ids=id_list,
        process=process,
        since=None if since is None else _aware(since),
        until=None if until is None else _aware(until),
        limit=limit,
    )
    if not found:
        return []
    done = _already_requeued(conn, adapter, found)
    todo = [head for head in found if head.id not in done]
    if dry_run or not todo:
        return [Requeued(h.id, h.live_id, h.process, None) for h in todo]
    payloads = _original_payloads(conn, adapter, [h for h in todo if h.payload_text is None])
    rows = [_requeued_row(head, payloads) for head in todo]
    keys = _take_unique_keys(conn, adapter.table, todo, rows)
    new_ids: list[int] = []
    for start in range(0, len(rows), REQUEUE_CHUNK):
        new_ids += adapter.task_insert_many(conn, rows=rows[start : start + REQUEUE_CHUNK])
        if progress is not None:
            progress(len(new_ids), len(rows), f"requeued {len(new_ids)}")
    for decision, new_id in zip(keys, new_ids, strict=True):
        if decision is not None:
            unique.bind(conn, adapter.table, decision, new_id)
    # a workflow step's requeue resumes its workflow (docs/workflows.md)
    resume_steps(
        conn,
        adapter,
        [
            (head.live_id, new_id)
            for head, new_id in zip(todo, new_ids, strict=True)
            if head.live_id is not None
        ],
    )
    return [
        Requeued(head.id, head.live_id, head.process, new_id)
        for head, new_id in zip(todo, new_ids, strict=True)
    ]


def _take_unique_keys(
    conn: Connection, table: Any, heads: list[TaskRecord], rows: list[dict[str, Any]]
) -> list[unique.Decision | None]:
    """Each requeued row of a unique process admitted as an enqueue is
    (unique.admit), any duplicate refused; the keys taken, to bind to the
    new ids (None: not a unique task)."""
    policies = unique.policies_of(table)
    if not policies:
        return [None] * len(rows)
    now = utcnow()
    taken: list[unique.Decision | None] = []
    seen: dict[str, int] = {}
    for head, row in zip(heads, rows, strict=True):
        rule = policies.get(str(row.get("processo")))
        external_key = row.get("chave_externa")
        if rule is None or external_key is None:
            taken.append(None)
            continue
        key = unique.key_of(rule.process, row.get("tenant"), external_key)
        if key in seen:
            raise DuplicateTaskError(
                f"dead tasks {seen[key]} and {head.id} have one unique key (process "
                f"{rule.process!r}, external key {external_key!r}): requeue one of them"
            )
        seen[key] = head.id
        try:
            taken.append(unique.admit(conn, table, row, now, refuse=True))
        except DuplicateTaskError as exc:
            raise DuplicateTaskError(f"dead task {head.id} not requeued: {exc}") from None
    return taken


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def _link(head: TaskRecord) -> int:
    """The ``live_id`` a requeued chain carries: the original chain's id
    (a head that lost it, from the reference, links to itself)."""
    return head.live_id if head.live_id is not None else head.id


def _already_requeued(conn: Connection, adapter: Adapter, heads: list[TaskRecord]) -> set[int]:
    """The heads that already have a requeued chain. A locking read: it sees
    what another requeue committed while this one waited for the heads."""
    links = sorted({_link(head) for head in heads})
    return adapter.task_requeued_of(conn, live_ids=links, head_ids=[head.id for head in heads])


def _original_payloads(
    conn: Connection, adapter: Adapter, heads: list[TaskRecord]
) -> dict[int, str | None]:
    """Payloads from the original first attempts, for heads without one
    (the reference's rescued dead rows lost theirs)."""
    originals = sorted({head.live_id for head in heads if head.live_id is not None})
    if not originals:
        return {}
    return adapter.task_payloads(conn, ids=originals)


def _requeued_row(head: TaskRecord, payloads: dict[int, str | None]) -> dict[str, Any]:
    payload = head.payload_text
    if payload is None and head.live_id is not None:
        payload = payloads.get(head.live_id)
    return {
        **carried_columns(head),
        "tentativa": 1,
        "status": Status.PENDING.value,
        "payload": payload,
        "dead": False,
        "live_id": _link(head),
        "id_anterior": head.id,
        "data_hora_anterior": head.run_at,
        "status_anterior": head.status,
        "mensagem_anterior": head.message,
    }
