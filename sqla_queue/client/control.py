"""An operator's actions on waiting tasks: cancel one, cancel a process's,
run a scheduled one now. Each writes in the caller's transaction (a
Session's or a Connection's) and commits nothing; ``QueueClient.cancel``,
``cancel_process`` and ``retry_now`` are the usual way in, and
``sqla-queue cancel`` / ``retry-now`` the command line's.

Only a waiting attempt changes (``pendente`` or ``agendada``). A running
task is never touched: its worker owns it until it ends. A cancelled
attempt becomes ``falha`` with ``mensagem`` "Tarefa cancelada pelo
operador." and ``estouro_tentativas`` false, a final state a reader of the
seed's columns understands (the task failed, no retry follows, it is not
in the dead letter); ``sqla-queue status`` counts it as cancelled. Against a
worker claiming the same row at the same moment, exactly one wins.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection

from ..adapters import Adapter
from ..common.exceptions import TaskNotFoundError, TaskStateError
from ..common.types import utcnow
from ..schema.mixins import Status
from ..schema.rows import CANCELLED_MESSAGE

__all__ = ["CANCEL_CHUNK", "Cancelled", "cancel_process", "cancel_task", "retry_now"]

#: a process's waiting tasks are cancelled this many per statement
CANCEL_CHUNK = 1_000

# no older_than: every waiting task, scheduled ones far ahead included
_NO_BOUND = dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Cancelled:
    """The waiting attempts an action found (their ids) and how many it
    changed (fewer when a worker claimed one in between)."""

    ids: tuple[int, ...]
    count: int


def _chain_key(conn: Connection, adapter: Adapter, task_id: int) -> tuple[int, str | None]:
    """The chain of the row ``task_id`` (its first attempt's id) and that
    row's status."""
    row = adapter.inspection.task_row(conn, task_id=task_id)
    if row is None:
        raise TaskNotFoundError(f"no task {task_id} in {adapter.table.name}")
    return row.id_inicial or row.id, row.status


def cancel_task(conn: Connection, adapter: Adapter, task_id: int) -> Cancelled:
    """Cancel the task ``task_id`` (any attempt's id of it): its waiting
    attempt becomes ``falha`` (see the module). Raises
    :class:`~sqla_queue.common.exceptions.TaskStateError` when nothing of its
    chain waits (it runs, or it has finished)."""
    key, status = _chain_key(conn, adapter, task_id)
    actions = adapter.actions
    waiting = actions.waiting_of_chain(conn, key=key)
    count = actions.cancel(conn, ids=waiting, message=CANCELLED_MESSAGE) if waiting else 0
    if count:
        return Cancelled(tuple(waiting), count)
    raise TaskStateError(_not_waiting(task_id, status, "cancelled"))


def cancel_process(
    conn: Connection,
    adapter: Adapter,
    process: str,
    *,
    older_than: dt.timedelta | None = None,
    limit: int = CANCEL_CHUNK,
    now: dt.datetime | None = None,
) -> Cancelled:
    """Cancel up to ``limit`` waiting tasks of ``process`` (not dead-letter
    runs); with ``older_than``, only those whose first attempt's time
    (``data_hora_inicial``) is more than ``older_than`` ago.
    Call again until it cancels nothing (the command commits each call)."""
    before = _NO_BOUND if older_than is None else (now or utcnow()) - older_than
    actions = adapter.actions
    waiting = actions.waiting_of_process(conn, process=process, before=before, limit=limit)
    if not waiting:
        return Cancelled((), 0)
    # a row a worker claimed between the two statements is left alone
    return Cancelled(tuple(waiting), actions.cancel(conn, ids=waiting, message=CANCELLED_MESSAGE))


def retry_now(conn: Connection, adapter: Adapter, task_id: int) -> int:
    """Run the task ``task_id``'s next attempt now: its ``agendada``
    attempt (a retry waiting out its backoff, or a task scheduled for
    later) becomes ``pendente`` with ``data_hora`` now, and the workers are
    woken (on PostgreSQL, at commit). Returns that attempt's id; raises
    :class:`~sqla_queue.common.exceptions.TaskStateError` when none is scheduled."""
    key, status = _chain_key(conn, adapter, task_id)
    actions = adapter.actions
    for attempt_id in actions.waiting_of_chain(conn, key=key):
        if actions.run_now(conn, task_id=attempt_id):
            if adapter.supports_notify:
                adapter.notify(conn)
            return attempt_id
    raise TaskStateError(_not_waiting(task_id, status, "run now", scheduled=True))


def _not_waiting(task_id: int, status: str | None, verb: str, *, scheduled: bool = False) -> str:
    what = "scheduled" if scheduled else "pending or scheduled"
    if status == Status.PROCESSING.value:
        return f"task {task_id} is running: not {verb}"
    return f"task {task_id} has no {what} attempt (it runs or has finished): not {verb}"
