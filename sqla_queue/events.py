"""The flush hook that completes queue rows inside the caller's transaction.

``install(Session)`` registers one ``before_flush`` listener on a Session
class or sessionmaker. For every new (or re-assigned) queue row it serialises
the payload once, stores its hash, and sets the status: ``agendada`` when
``run_at`` is in the future, else ``pendente``. Nothing here commits: the row
is written by the flush the application was doing anyway, so it commits or
rolls back with the business change.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapper, Session, UOWTransaction, sessionmaker

from .exceptions import NotInstalledError
from .mixins import QueueMixin, Status, has_pending_payload, take_pending_payload
from .payload import hash_payload, serialize_payload
from .types import utcnow

__all__ = ["install", "prepare_task", "uninstall"]

SessionTarget = type[Session] | sessionmaker[Any] | Session
_installed: list[SessionTarget] = []


_PREPARED = "_sqla_queue_prepared"


def install(target: SessionTarget = Session) -> None:
    """Complete queue rows on flush for sessions of ``target`` (idempotent)."""
    if not event.contains(target, "before_flush", _before_flush):
        event.listen(target, "before_flush", _before_flush)
        _installed.append(target)


def uninstall(target: SessionTarget | None = None) -> None:
    """Undo :func:`install` for ``target``, or for every target when None."""
    for installed in list(_installed):
        if target is None or installed is target:
            if event.contains(installed, "before_flush", _before_flush):
                event.remove(installed, "before_flush", _before_flush)
            _installed.remove(installed)


def prepare_task(task: QueueMixin) -> None:
    """Serialise and hash the payload and set the initial status."""
    if has_pending_payload(task):
        # serialise before taking the value: on error the task keeps it
        text = serialize_payload(task.payload)
        take_pending_payload(task)
        task.payload_text = text
        task.payload_hash = hash_payload(text)
    if task.run_at is not None and task.run_at.tzinfo is None:
        task.run_at = task.run_at.replace(tzinfo=dt.timezone.utc)  # naive means UTC
    if task.status is None:
        scheduled = task.run_at is not None and task.run_at > utcnow()
        task.status = Status.SCHEDULED.value if scheduled else Status.PENDING.value
    if task.first_run_at is None and task.run_at is not None:
        task.first_run_at = task.run_at
    task.__dict__[_PREPARED] = True


def _before_flush(session: Session, flush_context: UOWTransaction, instances: Any) -> None:
    for obj in list(session.new) + list(session.dirty):
        if isinstance(obj, QueueMixin) and (obj in session.new or has_pending_payload(obj)):
            prepare_task(obj)


@event.listens_for(QueueMixin, "before_insert", propagate=True)
@event.listens_for(QueueMixin, "before_update", propagate=True)
def _refuse_unprepared(mapper: Mapper[Any], connection: Connection, target: QueueMixin) -> None:
    # without the hook a task would be stored unhashed, with a wrong status
    # (a future run_at stored 'pendente') and without its first run time
    if has_pending_payload(target) or not target.__dict__.get(_PREPARED):
        raise NotInstalledError()
