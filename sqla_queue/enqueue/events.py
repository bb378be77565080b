"""The flush hook that completes queue rows inside the caller's transaction.

``install(Session)`` registers one ``before_flush`` listener on a Session
class or sessionmaker. For every new queue row it serialises the payload
once, stores its hash, and sets the status: ``agendada`` when ``run_at`` is
in the future, else ``pendente``. A stored row is already complete: it is
only touched when its payload is re-assigned (serialised and hashed again) or
its ``payload_text`` assigned directly (hashed as is). Nothing here commits:
the row is written by the flush the application was doing anyway, so it
commits or rolls back with the business change.

An ``AsyncSession`` flushes through a plain ``Session`` of its own
(``sync_session``), in a greenlet, so async code is served by the same
listener: ``install()`` takes an AsyncSession class, an
``async_sessionmaker`` or an AsyncSession and registers it on the sync
target SQLAlchemy's asyncio layer flushes through (see
:func:`_flushed_through`). The fast writer and the unique-task admission
run inside that flush, on its sync connection, as they do for a Session.

Every other way into the table through the ORM either gets the same
preparation or fails loudly; none stores a row without its hash or with a
wrong status:

- ``session.merge(Task(payload=...))``: the pending payload travels in a
  mapped column (``payload_hash``, see ``PendingHash``), so merge copies it.
- ``session.execute(insert(Task), [{...}])``, the ORM bulk INSERT: prepared
  from its parameters by a ``do_orm_execute`` listener on every Session,
  which refuses (``NotInstalledError``) where the flush hook is not installed.
- ``session.bulk_save_objects()``: no hook runs for it; the row's
  ``PendingHash`` fails to bind (``UnpreparedTaskError``).
- an ORM UPDATE statement setting ``payload``/``payload_text`` without
  ``payload_hash``: refused (``UnpreparedTaskError``).
- a flush without the hook: refused by mapper events (``NotInstalledError``).

Not seen: ``bulk_insert_mappings()`` (plain dicts, no event; on SQLAlchemy 2.1
a ``payload`` key in them is refused) and Core statements on the Table, which
write raw columns as plain SQL does.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import event, inspect
from sqlalchemy.engine import Connection, Result
from sqlalchemy.orm import (
    Mapper,
    ORMExecuteState,
    Session,
    UOWTransaction,
    object_session,
    sessionmaker,
)

from ..adapters.sqla_private import embedded_values
from ..common.exceptions import NotInstalledError, UnpreparedTaskError
from ..common.payload import hash_payload, serialize_payload
from ..common.stamps import current as current_stamps
from ..common.stamps import registered as stamps_registered
from ..common.types import utcnow
from ..schema.mixins import PREPARED_ROW, QueueMixin, Status, pending_payload
from ..schema.payload_keys import attribute_plan, missing_values
from ..schema.validation import check_attributes
from . import unique

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

__all__ = ["install", "prepare_task", "uninstall"]

#: what :func:`install` takes: the sync targets SQLAlchemy's session events
#: take, and their asyncio counterparts
SessionTarget: TypeAlias = (
    "type[Session] | sessionmaker[Any] | Session"
    " | type[AsyncSession] | async_sessionmaker[Any] | AsyncSession"
)
_SyncTarget: TypeAlias = "type[Session] | sessionmaker[Any] | Session"
# (what install() was given, the sync target its listener is on): two
# targets may share a listener (install(Session) and install(AsyncSession))
_installed: list[tuple[SessionTarget, _SyncTarget]] = []


_PREPARED = "_sqla_queue_prepared"
# the payload_text a stored row was last hashed for, by the hook
_HASHED_TEXT = "_sqla_queue_hashed_text"
_NONE: Any = object()
_HOOK_RAN = "sqla_queue_hook_ran"


def install(target: SessionTarget = Session) -> None:
    """Complete queue rows on flush for sessions of ``target`` (idempotent):
    a Session class, a sessionmaker or a Session, or their asyncio
    counterparts (an AsyncSession class, an ``async_sessionmaker`` or an
    AsyncSession). ``install(AsyncSession)`` is ``install(Session)`` when
    ``AsyncSession.sync_session_class`` is ``Session``, as it is unless
    configured: an AsyncSession flushes through a plain Session."""
    sync = _flushed_through(target)
    if not any(given is target for given, _ in _installed):
        _installed.append((target, sync))
    if not event.contains(sync, "before_flush", _before_flush):
        event.listen(sync, "before_flush", _before_flush)


def uninstall(target: SessionTarget | None = None) -> None:
    """Undo :func:`install` for ``target``, or for every target when None.
    A listener another installed target shares stays."""
    removed = [entry for entry in _installed if target is None or entry[0] is target]
    for entry in removed:
        _installed.remove(entry)
    for _, sync in removed:
        shared = any(other is sync for _, other in _installed)
        if not shared and event.contains(sync, "before_flush", _before_flush):
            event.remove(sync, "before_flush", _before_flush)


def _flushed_through(target: SessionTarget) -> _SyncTarget:
    """The sync target whose sessions do ``target``'s flushes.

    An AsyncSession flushes through its ``sync_session``; an AsyncSession
    class through its ``sync_session_class``. An ``async_sessionmaker``
    through the ``sync_session_class`` it was configured with, else through
    a subclass of its class's that this gives it (``configure()``), as a
    sessionmaker makes a subclass of its own: installing on one maker
    reaches that maker's sessions, not every Session of the process."""
    if isinstance(target, (Session, sessionmaker)) or (
        isinstance(target, type) and issubclass(target, Session)
    ):
        return target
    # An async target exists only once sqlalchemy.ext.asyncio is imported;
    # importing it here would fail without greenlet, which sync code lacks.
    aio = sys.modules.get("sqlalchemy.ext.asyncio")
    if aio is None:
        return target  # type: ignore[return-value]  # event.listen says what is wrong
    if isinstance(target, aio.AsyncSession):
        return target.sync_session  # type: ignore[no-any-return]
    if isinstance(target, type) and issubclass(target, aio.AsyncSession):
        return target.sync_session_class  # type: ignore[no-any-return]
    if isinstance(target, aio.async_sessionmaker):
        sync = target.kw.get("sync_session_class")
        if sync is None:
            base = target.class_.sync_session_class
            sync = type(base.__name__, (base,), {})
            target.configure(sync_session_class=sync)
        return sync  # type: ignore[no-any-return]
    return target  # type: ignore[return-value]


def _is_installed(session: Session) -> bool:
    # the session's listeners: its class's, its sessionmaker's and its own
    return _before_flush in list(session.dispatch.before_flush)


# -------------------------------------------------------------- the flush
def prepare_task(task: QueueMixin) -> None:
    """Complete a new row: payload text and hash, status, first run time;
    its values checked first (``validation.py``)."""
    for key, value in check_attributes(task.__dict__).items():
        setattr(task, key, value)
    keyed = attribute_plan(type(task).__mapper__)  # type: ignore[attr-defined]
    if keyed:
        _fill_payload_keys(task, keyed)
    _prepare_payload(task, new=True)
    if task.run_at is not None and task.run_at.tzinfo is None:
        task.run_at = task.run_at.replace(tzinfo=dt.timezone.utc)  # naive means UTC
    if task.status is None:
        scheduled = task.run_at is not None and task.run_at > utcnow()
        task.status = Status.SCHEDULED.value if scheduled else Status.PENDING.value
    if task.first_run_at is None and task.run_at is not None:
        task.first_run_at = task.run_at
    if stamps_registered():
        _stamp(task)
    task.__dict__[_PREPARED] = True


def _fill_payload_keys(task: QueueMixin, plan: tuple[tuple[str, str, int], ...]) -> None:
    """The columns filled from payload keys (payload_keys.py), where the
    task has no value of its own."""
    pending = pending_payload(task)
    payload = pending.payload if pending is not None and pending.has_payload else None
    for attribute, value in missing_values(plan, payload, task.__dict__).items():
        if value is not None:
            setattr(task, attribute, value)


def _stamp(task: QueueMixin) -> None:
    """The registered stamps' values (stamps.py) where the task has none."""
    mapper = inspect(task).mapper
    for name, value in current_stamps().items():
        column = mapper.local_table.c.get(name)
        if column is None:
            continue
        key = mapper.get_property_by_column(column).key
        if getattr(task, key) is None:
            setattr(task, key, value)


def _changed(task: QueueMixin, key: str) -> bool:
    return bool(inspect(task).attrs[key].history.added)


def _set_hash_of_text(task: QueueMixin) -> None:
    text = task.payload_text
    task.payload_hash = hash_payload(text)
    task.__dict__[_HASHED_TEXT] = text


def _prepare_payload(task: QueueMixin, *, new: bool) -> None:
    pending = pending_payload(task)
    if pending is not None and pending.has_payload:
        # serialise before replacing the placeholder: on error the task keeps it
        text = serialize_payload(pending.payload)
        task.payload_text = text
        task.payload_hash = hash_payload(text)
        task.__dict__[_HASHED_TEXT] = text
    elif pending is not None:
        # no payload assigned and no hash given
        if new or _changed(task, "payload_text"):
            _set_hash_of_text(task)
        else:
            # merge() copied a new instance's placeholder onto a stored row:
            # the stored hash stays (a retry row has a hash and no text)
            session = object_session(task)
            assert session is not None
            session.expire(task, ["payload_hash"])
    elif not new and _changed(task, "payload_text") and not _changed(task, "payload_hash"):
        _set_hash_of_text(task)  # the raw column assigned: stored as is, hashed


def _before_flush(session: Session, flush_context: UOWTransaction, instances: Any) -> None:
    # once per flush, however many of the session's targets have it: a
    # sessionmaker's (or an async_sessionmaker's) class is a subclass of
    # Session, and listeners on both are both called
    if _HOOK_RAN in flush_context.attributes:
        return
    flush_context.attributes[_HOOK_RAN] = True
    new = session.new
    tasks = [obj for obj in new if isinstance(obj, QueueMixin)]
    for obj in tasks:
        prepare_task(obj)
    if tasks and unique.declared_any:
        tasks = unique.admit_new_tasks(session, tasks, utcnow())
    for obj in session.dirty:
        if isinstance(obj, QueueMixin) and obj not in new:
            _prepare_payload(obj, new=False)
    if tasks and _fast_writer is not None and instances is None:
        _fast_writer(session, tasks)
    if tasks and unique.declared_any:
        unique.bind_written(session)  # the written tasks' keys: a flush left with no work ends here


#: writes new tasks itself before the flush (flush_insert.py, plugged in by
#: the package on import; None: the ORM's unit of work writes them)
_fast_writer: Any = None


def set_fast_writer(writer: Any) -> None:
    """Plug in (or, with None, remove) the writer of new tasks."""
    global _fast_writer
    _fast_writer = writer


@event.listens_for(QueueMixin, "before_insert", propagate=True)
def _refuse_unprepared_insert(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    # without the hook a task would be stored unhashed, with a wrong status
    # (a future run_at stored 'pendente') and without its first run time
    if pending_payload(target) is not None or not target.__dict__.get(_PREPARED):
        raise NotInstalledError()


@event.listens_for(QueueMixin, "before_update", propagate=True)
def _refuse_unprepared_update(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    # A stored row is complete: handlers and admin code update their rows
    # (message, status...) with or without the hook. Only a new payload, or
    # a payload_text the hook did not hash, would be stored wrong.
    if pending_payload(target) is not None:
        raise NotInstalledError()
    if (
        _changed(target, "payload_text")
        and not _changed(target, "payload_hash")
        and target.__dict__.get(_HASHED_TEXT, _NONE) is not target.__dict__["payload_text"]
    ):
        raise NotInstalledError()


# ------------------------------------------------ ORM INSERT and UPDATE
@event.listens_for(Session, "do_orm_execute")
def _prepare_orm_dml(state: ORMExecuteState) -> Result[Any] | None:
    """Prepare ``session.execute(insert(Task), rows)`` from its parameters,
    and refuse an ORM UPDATE that would store a payload without its hash.

    Registered on every Session, not by ``install()``: without the flush hook
    an ORM INSERT is refused, as a flush would be; it is the same check. Core
    statements on the Table (``insert(Task.__table__)``) are left alone: raw
    columns, as plain SQL."""
    if not (state.is_insert or state.is_update) or not state.is_orm_statement:
        return None
    mapper = state.bind_mapper
    if mapper is None or not issubclass(mapper.class_, QueueMixin):
        return None
    if state.is_update:
        _refuse_payload_update(state)
        return None
    if not _is_installed(state.session):
        raise NotInstalledError()
    statement: Any = state.statement
    embedded = embedded_values(statement) or getattr(statement, "select", None) is not None
    if not state.parameters or embedded:
        raise UnpreparedTaskError(
            "sqla-queue prepares an ORM INSERT of tasks from its parameters only: "
            "use session.execute(insert(Task), [{...}, ...]), not .values() or "
            "from_select(), or session.add_all() or QueueClient.insert_tasks()"
        )
    now = utcnow()
    parameters: Any = state.parameters
    keyed = attribute_plan(mapper)
    if state.is_executemany:
        rows: Any = [_prepared_row(row, now, keyed) for row in parameters]
    else:
        rows = _prepared_row(parameters, now, keyed)
    return state.invoke_statement(params=rows)


def _refuse_payload_update(state: ORMExecuteState) -> None:
    # the names the statement sets: parameter keys, and .values() keys, which
    # are names, attributes or columns (the payload column's key is "payload")
    parameters: Any = state.parameters or ()
    keys: list[Any] = []
    for row in [parameters] if isinstance(parameters, Mapping) else parameters:
        keys.extend(row)
    keys.extend(embedded_values(state.statement))
    names = {str(getattr(key, "key", key)) for key in keys}
    if names & {"payload", "payload_text"} and "payload_hash" not in names:
        raise UnpreparedTaskError(
            "an ORM UPDATE statement does not serialise or hash a task's payload: "
            "load the task and assign task.payload (the flush hook hashes it), "
            "or set payload_hash in the same statement"
        )


def _prepared_row(
    row: Mapping[str, Any], now: dt.datetime, keyed: tuple[tuple[str, str, int], ...] = ()
) -> dict[str, Any]:
    """What a parameter set of an ORM INSERT (attribute names) lacks, as
    :func:`prepare_task` completes an instance; merged into a copy of it.
    ``keyed``: the model's columns filled from payload keys."""
    extra: dict[str, Any] = check_attributes(row)
    extra[PREPARED_ROW] = True
    if keyed:
        extra.update(missing_values(keyed, row.get("payload"), row))
    if "payload" in row:
        text = serialize_payload(row["payload"])
        extra["payload_text"] = text
        extra["payload_hash"] = hash_payload(text)
    elif "payload_hash" not in row:
        extra["payload_hash"] = hash_payload(row.get("payload_text"))
    run_at = row.get("run_at")
    if run_at is not None and run_at.tzinfo is None:
        run_at = extra["run_at"] = run_at.replace(tzinfo=dt.timezone.utc)
    if row.get("status") is None:
        scheduled = run_at is not None and run_at > now
        extra["status"] = Status.SCHEDULED.value if scheduled else Status.PENDING.value
    if row.get("first_run_at") is None and run_at is not None:
        extra["first_run_at"] = run_at
    if stamps_registered():
        for name, value in current_stamps().items():
            if row.get(name) is None:
                extra[name] = value
    return extra
