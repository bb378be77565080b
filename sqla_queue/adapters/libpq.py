"""One task's INSERT handed to libpq itself, on a psycopg 3 connection.

An enqueue on PostgreSQL is three statements (``BEGIN``, the INSERT,
``COMMIT``) and, on a machine where the client's CPU bounds it, psycopg's
cursor spends more on the INSERT than on anything of sqla-queue's: a new
cursor, the query converted and its parameters dumped through the adapters
map, the prepare manager's bookkeeping, the result wrapped
(docs/benchmarks.md, "The gaps"). Here the adapter's direct INSERT
(``Adapter.task_insert_one``: the statement SQLAlchemy compiled once, its
bind processors already run) goes to libpq through psycopg's own wrapper
(``psycopg.pq``, with ``Connection.wait`` and psycopg's generators, so a
query still waits interruptibly and notifications are still dispatched):
the parameters encoded by their column's type, the id read from the one
row it returns. The statement is prepared on the server under a name of
its own (``sqlaq_<hash>``), in the same round trip as its first run,
wherever psycopg prepares its own statements, and forgotten whenever
psycopg deallocates its own (see :func:`_prepared_on`); unnamed with
``prepare_threshold=None``.

It takes a statement only where the result cannot differ from the
cursor's; otherwise :func:`insert` returns None and the cursor runs it
(and always with ``SQLA_QUEUE_LIBPQ_INSERT=false``):

- a sync psycopg 3 connection, healthy, not in autocommit or pipeline mode,
  in a transaction, or idle with psycopg's plain ``BEGIN`` (no isolation
  level, read-only or deferrable setting). That ``BEGIN`` is sent here, as
  psycopg would send it, in the same round trip as the INSERT (libpq's
  pipeline mode, left before returning): one round trip of the three an
  enqueue costs;
- client encoding UTF8;
- every column of the statement a string, integer, boolean, binary, date
  or timestamp type, and every value of exactly the Python type its column
  takes (``str`` without NUL, ``int``, ``bool``, ``bytes`` or the
  ``psycopg.Binary`` SQLAlchemy wraps it in, ``datetime``, ``date``) or None.

An error comes back as the exception psycopg raises for the same result
(``psycopg.errors.error_from_result``), so the caller's
``DriverErrors`` turns it into SQLAlchemy's as for the cursor.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.types import TypeDecorator, TypeEngine

from ..config.kinds import EnvFlag

try:  # psycopg 3 is the postgresql extra's driver; without it nothing is taken
    import psycopg
    from psycopg import generators, pq
    from psycopg.dbapi20 import Binary as _Binary
    from psycopg.errors import error_from_result

    # libpq's codes as plain module constants: read on every enqueue
    _CONNECTION_OK = pq.ConnStatus.OK
    _PIPELINE_OFF = pq.PipelineStatus.OFF
    _IDLE, _INTRANS = pq.TransactionStatus.IDLE, pq.TransactionStatus.INTRANS
    _COMMAND_OK, _TUPLES_OK = pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK
    _FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
except ImportError:  # pragma: no cover - the base install
    psycopg = None  # type: ignore[assignment]
    _Binary = None  # type: ignore[assignment,misc]

__all__ = ["RowPlan", "Statement", "insert", "row_plan", "statement_for"]

#: ``SQLA_QUEUE_LIBPQ_INSERT`` (default true): false leaves every INSERT to psycopg
enabled = EnvFlag("SQLA_QUEUE_LIBPQ_INSERT", default=True)
#: whether this libpq has pipeline mode (14 and later), asked once
_PIPELINE = psycopg is not None and psycopg.Pipeline.is_supported()
_BIND = re.compile(r"%\((\w+)\)s|%%")
_TEXT, _BINARY = 0, 1


#: on a TypeDecorator: its bind processing leaves a value of exactly the
#: Python type its column takes (or None) as it is (sqla_queue.common.types.PayloadHash)
BINDS_EXACT_AS_IS = "sqla_queue_binds_exact_as_is"


def _as_is_for(type_: TypeEngine[Any]) -> type | None:
    """The Python type whose values (exactly that type, or None) the bind
    processor of a column of ``type_`` passes on unchanged, or wraps in
    what :func:`_encoded` unwraps (``psycopg.Binary``): SQLAlchemy's own
    string, number, boolean, binary and date types, which only check or
    wrap, and a TypeDecorator that says so (:data:`BINDS_EXACT_AS_IS`).
    None: run the processor on every value."""
    if isinstance(type_, TypeDecorator) and not getattr(type_, BINDS_EXACT_AS_IS, False):
        return None
    return _python_type(type_)


def _python_type(type_: TypeEngine[Any]) -> type | None:
    """The Python type a column of ``type_`` is sent from here (None: not here)."""
    while isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    # Boolean before Integer, DateTime before Date: neither is the other's subclass
    # in SQLAlchemy, but the order keeps that true whatever a dialect type adds
    for sql_type, python in (
        (sqltypes.Boolean, bool),
        (sqltypes.Integer, int),
        (sqltypes.String, str),
        (sqltypes.LargeBinary, bytes),
        (sqltypes.DateTime, dt.datetime),
        (sqltypes.Date, dt.date),
    ):
        if isinstance(type_, sql_type):
            return python
    return None


class Statement:
    """A direct INSERT as libpq takes it: ``$n`` placeholders, and per
    parameter its name and the Python type its column takes."""

    __slots__ = ("name", "names", "sql", "types")

    def __init__(self, sql: bytes, names: tuple[str, ...], types: tuple[type, ...]) -> None:
        self.sql = sql
        self.names = names
        self.types = types
        #: its name as a prepared statement (psycopg's own are ``_pg3_<n>``)
        self.name = b"sqlaq_" + hashlib.sha1(sql).hexdigest()[:24].encode()


def statement_for(
    pyformat_sql: str, column_types: Mapping[str, TypeEngine[Any]]
) -> Statement | None:
    """The libpq form of a statement SQLAlchemy compiled for psycopg
    (``%(name)s`` placeholders, ``%%`` for a percent sign), given each
    bound column's type; None when a column's type is not one sent here."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        names.append(name)
        return f"${len(names)}"

    sql = _BIND.sub(number, pyformat_sql)
    types = []
    for name in names:
        python = _python_type(column_types[name]) if name in column_types else None
        if python is None:
            return None
        types.append(python)
    return Statement(sql.encode(), tuple(names), tuple(types))


class RowPlan:
    """A task row's INSERT as libpq takes it: the :class:`Statement`, and
    per parameter the row's column it takes or the constant (a column's
    scalar default), with the columns' bind processors to run."""

    __slots__ = ("processors", "sources", "sql", "statement")

    def __init__(
        self,
        statement: Statement,
        sql: str,
        sources: tuple[tuple[str, Any], ...],
        processors: tuple[tuple[int, Callable[[Any], Any], type | None], ...],
    ) -> None:
        self.statement = statement
        self.sql = sql  # SQLAlchemy's text of it, for error messages
        self.sources = sources
        self.processors = processors

    def values(self, row: Mapping[str, Any]) -> list[Any]:
        """The statement's parameters for ``row`` (a mapping of every column
        the plan was made for), in order."""
        get = row.get
        values = [get(name, constant) for name, constant in self.sources]
        for at, process, as_is in self.processors:
            value = values[at]
            if value is None or type(value) is not as_is:
                values[at] = process(value)
        return values


def row_plan(
    pyformat_sql: str,
    constants: Mapping[str, Any],
    processors: Mapping[str, Callable[[Any], Any]],
    column_types: Mapping[str, TypeEngine[Any]],
) -> RowPlan | None:
    """The :class:`RowPlan` of a direct INSERT SQLAlchemy compiled for
    psycopg, whose parameters are named after their columns: each one the
    row's value, or ``constants[name]`` for the columns the row has not;
    None when :func:`statement_for` gives no statement."""
    statement = statement_for(pyformat_sql, column_types)
    if statement is None or set(statement.names) != set(column_types):
        return None
    names = statement.names
    return RowPlan(
        statement,
        pyformat_sql,
        tuple((name, constants.get(name)) for name in names),
        tuple(
            (names.index(name), process, _as_is_for(column_types[name]))
            for name, process in processors.items()
        ),
    )


def _encoded(statement: Statement, params: Sequence[Any]) -> tuple[list[Any], list[int]] | None:
    values: list[Any] = []
    formats: list[int] = []
    for value, python in zip(params, statement.types, strict=True):
        if value is None:
            values.append(None)
            formats.append(_TEXT)
            continue
        kind = type(value)
        if kind is _Binary and python is bytes:  # what SQLAlchemy's LargeBinary binds
            value = value.obj
            kind = type(value)
        if kind is not python:
            return None  # a subclass (an IntEnum, a str enum...) or another type: psycopg's dumpers
        if python is str:
            if "\x00" in value:
                return None  # libpq would cut it there; psycopg refuses it
            values.append(value.encode())
        elif python is bool:
            values.append(b"t" if value else b"f")
        elif python is bytes:
            values.append(value)
            formats.append(_BINARY)
            continue
        else:  # int, datetime, date: their text form is PostgreSQL's input form
            values.append(str(value).encode() if python is int else value.isoformat().encode())
        formats.append(_TEXT)
    return values, formats


def _begin_needed(connection: Any) -> bool | None:
    """Whether a ``BEGIN`` must precede the statement (psycopg's plain one)
    on the psycopg ``connection``; None: leave the statement to psycopg (see
    the module)."""
    pgconn = connection.pgconn
    if (
        connection.autocommit
        or pgconn.status != _CONNECTION_OK
        or pgconn.pipeline_status != _PIPELINE_OFF
        or pgconn.parameter_status(b"client_encoding") != b"UTF8"
    ):
        return None
    status = pgconn.transaction_status
    if status == _INTRANS:
        return False
    if status != _IDLE or (
        connection.isolation_level is not None
        or connection.read_only is not None
        or connection.deferrable is not None
        or not _PIPELINE
    ):
        return None
    return True


#: per connection: the statements prepared on its server session
_prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
#: invalid_sql_statement_name, duplicate_prepared_statement
_NO_SUCH_STATEMENT, _ALREADY_PREPARED = b"26000", b"42P05"


def _prepared_on(connection: Any) -> set[bytes] | None:
    """The names prepared on ``connection``'s server session; None: send the
    statement unnamed.

    Unnamed where psycopg prepares nothing (``prepare_threshold=None``: a
    pooler that cannot keep prepared statements). Named statements follow
    psycopg's own: psycopg sends ``DEALLOCATE ALL`` when it rolls back a
    transaction or sees a DROP, ALTER, ``DISCARD ALL`` or ``DEALLOCATE ALL``
    while it holds prepared statements of its own (its prepare manager's
    ``clear()`` says so), which takes ours too: ours are forgotten with
    its. A psycopg without that manager gets unnamed statements."""
    if connection.prepare_threshold is None:
        return None
    known = _prepared.get(connection)
    if known is None:
        manager = getattr(connection, "_prepared", None)
        clear = getattr(manager, "clear", None)
        if clear is None:
            return None
        known = _prepared[connection] = set()

        def cleared() -> bool:
            deallocating: bool = clear()
            if deallocating:
                known.clear()
            return deallocating

        manager.clear = cleared  # type: ignore[union-attr]
    return known


#: one libpq call to send: the bound method and its arguments
_Command = tuple[Callable[..., None], tuple[Any, ...]]


def _round_trip(connection: Any, commands: list[_Command]) -> list[Any]:
    """Send ``commands`` in one round trip (libpq's pipeline mode for more
    than one) and return each one's last result. Left in pipeline mode by a
    wait cut short, the connection is closed: nothing may run on it half-read."""
    pgconn = connection.pgconn
    if len(commands) == 1:
        send, args = commands[0]
        send(*args)
        return [connection.wait(generators.execute(pgconn))[-1]]
    pgconn.enter_pipeline_mode()
    try:
        for send, args in commands:
            send(*args)
        pgconn.pipeline_sync()
        results = [connection.wait(generators.execute(pgconn))[-1]]
        for _ in commands[1:]:
            results.append(connection.wait(generators.fetch_many(pgconn))[-1])
        connection.wait(generators.fetch_many(pgconn))  # the sync point
    finally:
        try:
            pgconn.exit_pipeline_mode()
        except psycopg.Error:
            connection.close()
    return results


def _failed_with(result: Any, sqlstate: bytes) -> bool:
    return bool(
        result.status == _FATAL_ERROR
        and result.error_field(pq.DiagnosticField.SQLSTATE) == sqlstate
    )


def _attempt(
    connection: Any,
    statement: Statement,
    values: list[Any],
    formats: list[int],
    begin: bool,
    known: set[bytes] | None,
) -> tuple[list[Any], bool]:
    """One round trip: ``BEGIN`` (if ``begin``), the statement prepared if
    it is not yet (named when ``known`` is a set), and the statement. Its
    results, and False when the server's prepared statements were not what
    ``known`` said (the name is corrected: the statement did not run)."""
    pgconn = connection.pgconn
    commands: list[_Command] = []
    if begin:
        commands.append((pgconn.send_query_params, (b"BEGIN", None)))
    if known is None:
        commands.append((pgconn.send_query_params, (statement.sql, values, None, formats)))
        return _round_trip(connection, commands), True
    name = statement.name
    prepare = name not in known
    if prepare:
        commands.append((pgconn.send_prepare, (name, statement.sql)))
    commands.append((pgconn.send_query_prepared, (name, values, formats)))
    results = _round_trip(connection, commands)
    if not prepare:
        if _failed_with(results[-1], _NO_SUCH_STATEMENT):
            known.discard(name)  # deallocated behind psycopg's back
            return results, False
    elif results[-2].status == _COMMAND_OK:
        known.add(name)
    elif _failed_with(results[-2], _ALREADY_PREPARED):
        known.add(name)  # kept when thought lost
        return results, False
    return results, True


def _run(
    connection: Any, statement: Statement, values: list[Any], formats: list[int], begin: bool
) -> Any:
    """``BEGIN`` (if ``begin``), the statement prepared if it is not yet,
    and the statement, in one round trip; the statement's result.

    Should the server have lost a prepared statement (a ``DEALLOCATE ALL``
    psycopg did not send), or kept one thought lost, the name is corrected
    and, when the transaction is the one begun here (it holds nothing else:
    rolled back), the statement sent once more at once; in the caller's
    transaction, the error is the caller's, as after any failed statement,
    and the next call prepares it right."""
    known = _prepared_on(connection)
    results, settled = _attempt(connection, statement, values, formats, begin, known)
    if not settled and begin:
        pgconn = connection.pgconn
        pgconn.send_query(b"ROLLBACK")
        (rolled_back,) = connection.wait(generators.execute(pgconn))
        if rolled_back.status != _COMMAND_OK:
            raise error_from_result(rolled_back)
        results, _ = _attempt(connection, statement, values, formats, begin, known)
    for earlier in results[:-1]:  # BEGIN, PREPARE
        if earlier.status != _COMMAND_OK:
            raise error_from_result(earlier)
    return results[-1]


def insert(connection: Any, statement: Statement, params: Sequence[Any]) -> int | None:
    """Run ``statement`` (an INSERT returning one id) with ``params`` (in
    the statement's order) on the psycopg ``connection``; its id, or None
    when it is left to the cursor (see the module)."""
    if psycopg is None or type(connection) is not psycopg.Connection or not enabled():
        return None
    encoded = _encoded(statement, params)
    if encoded is None:
        return None
    values, formats = encoded
    with connection.lock:
        begin = _begin_needed(connection)
        if begin is None:
            return None
        result = _run(connection, statement, values, formats, begin)
    if result.status != _TUPLES_OK:
        raise error_from_result(result)
    return int(result.get_value(0, 0))
