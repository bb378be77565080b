"""SQLAlchemy's private API, as sqla-queue uses it (sqla_queue/adapters/sqla_private.py).

One test per private name: it is there, it takes what we pass it, and it
does what we use it for, on a real SQLite database (embedded: no server).
A SQLAlchemy release that renames or changes one fails here with the name
in the message, before it fails somewhere deep in a worker. CI runs this
file on the venv's SQLAlchemy (2.1.x) and on the newest 2.0.x
(``make test-sqlalchemy-2.0``).

And one test that reads the package's source: a private name of
SQLAlchemy's outside the fence module fails it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    String,
    create_engine,
    event,
    func,
    insert,
    literal,
    literal_column,
    select,
    table,
    update,
)
from sqlalchemy import column as sql_column
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool, Pool, QueuePool
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import ValuesBase
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Select

from sqla_queue.adapters import sqla_private
from sqla_queue.adapters.postgresql import _array_of
from sqla_queue.adapters.sqla_private import (
    PRIVATE_NAMES,
    async_connection_of,
    echo_on,
    embedded_values,
    events_flagged,
    invalidate_pooled,
    pool_max_overflow,
    register_persistent,
    traversed_clauses,
)
from sqla_queue.common.exceptions import SQLAlchemyChangedError
from sqla_queue.enqueue.flush_insert import _is
from tests.conftest import ROOT

VERSION = f"SQLAlchemy {sqlalchemy.__version__}"


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


class Base(DeclarativeBase):
    pass


class Thing(Base):
    __tablename__ = "thing"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(20))


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    engine = create_engine(f"sqlite:///{tmp_path / 'private.db'}", poolclass=QueuePool)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_register_persistent_makes_an_inserted_pending_object_persistent(engine: Engine) -> None:
    assert _parameters(Session._register_persistent)[:2] == ["self", "states"], (
        f"Session._register_persistent(states) changed in {VERSION}"
    )
    fired = []
    with Session(engine) as session:
        event.listen(session, "pending_to_persistent", lambda _, obj: fired.append(obj))
        thing = Thing(name="a")
        session.add(thing)
        new_id = (
            session.connection().execute(insert(Thing).values(name="a")).inserted_primary_key[0]
        )
        state = sqlalchemy.inspect(thing)
        state.dict["id"] = new_id
        register_persistent(session, {state})
        assert state.persistent, (
            f"Session._register_persistent left the object pending in {VERSION}"
        )
        assert fired == [thing]
        assert session.get(Thing, new_id) is thing  # in the identity map
        session.flush()  # nothing left to insert
        assert session.scalar(select(func.count()).select_from(Thing)) == 1
        session.rollback()
        assert state.transient, f"a rollback no longer expunges it in {VERSION}"
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Thing)) == 0


def test_invalidate_pooled_invalidates_the_connection_and_the_older_pooled_ones(
    engine: Engine,
) -> None:
    assert _parameters(Pool._invalidate)[:3] == ["self", "connection", "exception"], (
        f"Pool._invalidate(connection, exception) changed in {VERSION}"
    )
    older = engine.connect()
    older_dbapi = older.connection.dbapi_connection
    conn = engine.connect()
    older.close()  # back to the pool
    pooled = conn.connection
    invalidate_pooled(conn, ConnectionError("lost"))
    assert not pooled.is_valid, (
        f"Pool._invalidate no longer invalidates the pooled connection in {VERSION}"
    )
    conn.invalidate()  # what DriverErrors does next
    conn.close()
    with engine.connect() as fresh:
        assert fresh.connection.dbapi_connection is not older_dbapi, (
            f"Pool._invalidate no longer recycles the pool's older connections in {VERSION}"
        )


def test_async_connection_of_finds_the_async_connection_of_a_sync_one(tmp_path: Path) -> None:
    assert _parameters(AsyncConnection._retrieve_proxy_for_target)[:1] == ["target"], (
        f"AsyncConnection._retrieve_proxy_for_target(target) changed in {VERSION}"
    )

    async def check() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'async.db'}")
        try:
            async with engine.connect() as conn:
                assert async_connection_of(conn.sync_connection) is conn
        finally:
            await engine.dispose()

    asyncio.run(check())


def test_echo_on_reads_the_connection_echo(tmp_path: Path) -> None:
    for echo in (False, True):
        engine = create_engine(f"sqlite:///{tmp_path / 'echo.db'}", echo=echo)
        with engine.connect() as conn:
            assert "_echo" in vars(conn), f"Connection._echo is gone in {VERSION}"
            assert echo_on(conn) is echo
        engine.dispose()


def test_events_flagged_follows_sqlalchemys_listener_flags(tmp_path: Path) -> None:
    """Each ``_has_events`` is False until a listener is on its object. (The
    dialect's is True in any process that imported sqla-queue: its
    ``handle_error`` listener, sqla_queue/enqueue/unique.py.)"""
    for cls in (Connection, Engine, DefaultDialect):
        assert hasattr(cls, "_has_events"), f"{cls.__name__}._has_events is gone in {VERSION}"

    def listener(*_: Any) -> None:
        pass

    engine = create_engine(f"sqlite:///{tmp_path / 'events.db'}")
    with engine.connect() as conn:
        assert not conn._has_events and not engine._has_events
        event.listen(conn, "before_cursor_execute", listener)
        assert conn._has_events, f"Connection._has_events not set by a listener in {VERSION}"
        assert events_flagged(conn)
    event.listen(engine, "before_cursor_execute", listener)
    assert engine._has_events, f"Engine._has_events not set by a listener in {VERSION}"
    with engine.connect() as conn:
        assert events_flagged(conn)
    engine.dispose()
    dialect = DefaultDialect()
    event.listen(dialect, "do_execute", listener)
    assert dialect._has_events, f"Dialect._has_events not set by a listener in {VERSION}"


def test_pool_max_overflow_is_the_queue_pools_bound() -> None:
    assert "max_overflow" in _parameters(QueuePool.__init__)
    engine = create_engine("sqlite://", poolclass=QueuePool, pool_size=2, max_overflow=3)
    assert pool_max_overflow(engine.pool) == 3, f"QueuePool._max_overflow changed in {VERSION}"
    assert pool_max_overflow(create_engine("sqlite://", poolclass=NullPool).pool) is None


def test_embedded_values_are_those_of_values_only() -> None:
    for name in ("_values", "_multi_values"):
        assert hasattr(ValuesBase, name), f"ValuesBase.{name} is gone in {VERSION}"
    t = table("t", sql_column("a"), sql_column("b"))
    assert not embedded_values(insert(t))
    assert not embedded_values(update(t))
    assert [str(key) for key in embedded_values(insert(t).values(a=1))] == ["a"]
    assert len(embedded_values(insert(t).values([{"a": 1}, {"a": 2}]))[0]) == 2
    assert [str(key) for key in embedded_values(update(t).values(b=2))] == ["b"]


@traversed_clauses("subquery")
class _scalar_of(ColumnElement[Any]):
    inherit_cache = True

    def __init__(self, subquery: Select[Any]) -> None:
        self.subquery = subquery.scalar_subquery()
        self.type = Integer()


@compiles(_scalar_of)
def _compile_scalar_of(element: _scalar_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({compiler.process(element.subquery, **kw)})"


def test_traversed_clauses_key_the_statement_cache_on_the_clause(engine: Engine) -> None:
    """Statements holding the element are cached once per clause, with its
    bound values taken out: as SQLAlchemy caches its own elements."""
    assert _array_of.__dict__.get("_traverse_internals"), "postgresql._array_of lost its traversal"
    cache: dict[Any, Any] = {}
    with engine.connect().execution_options(compiled_cache=cache) as conn:
        # two clauses that differ in their SQL: two entries
        one = conn.scalar(select(_scalar_of(select(literal_column("1")))))
        two = conn.scalar(select(_scalar_of(select(literal_column("2")))))
        assert (one, two) == (1, 2)
        assert len(cache) == 2, f"_traverse_internals no longer keys the cache in {VERSION}"
        # the same clause with other bound values: one more entry, right values
        five = conn.scalar(select(_scalar_of(select(literal(5)))))
        six = conn.scalar(select(_scalar_of(select(literal(6)))))
        assert (five, six) == (5, 6)
        assert len(cache) == 3


def test_the_public_names_of_sqlalchemy_util_we_use_are_there() -> None:
    """Not private, but in SQLAlchemy's internal ``util`` package."""
    from sqlalchemy.util import await_only, greenlet_spawn
    from sqlalchemy.util.concurrency import in_greenlet

    assert callable(await_only) and callable(greenlet_spawn) and callable(in_greenlet)


def test_a_mapper_listener_is_the_function_or_a_closure_over_it() -> None:
    """flush_insert._is finds a model's own ``before_insert`` listener among
    the mapper's listeners, which SQLAlchemy may wrap in a closure."""

    class Base2(DeclarativeBase):
        pass

    class Listened(Base2):
        __tablename__ = "listened"
        id: Mapped[int] = mapped_column(primary_key=True)

    def before(*_: Any) -> None:
        pass

    for kw in ({}, {"raw": True}, {"propagate": True}):
        event.listen(Listened, "before_insert", before, **kw)
        listeners = list(sqlalchemy.inspect(Listened).dispatch.before_insert)
        assert any(_is(listener, before) for listener in listeners), (
            f"a before_insert listener ({kw}) is no longer the function or a closure over it "
            f"in {VERSION}"
        )
        event.remove(Listened, "before_insert", before)


def test_a_missing_private_name_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqla_private, "_HAS_REGISTER_PERSISTENT", False)
    assert not sqla_private.can_register_persistent()  # the flush takes the ORM's path
    with pytest.raises(SQLAlchemyChangedError) as error:
        register_persistent(Session(), set())
    assert str(error.value) == (
        "sqla-queue's register_persistent() relies on Session._register_persistent, which "
        f"{VERSION} does not have (sqla_queue/adapters/sqla_private.py)"
    )


def _private_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value  # getattr(x, "_echo")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            private = [alias.name for alias in node.names if alias.name.startswith("_")]
            if private or "._" in f".{node.module}":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import")
            continue
        if name in PRIVATE_NAMES:
            found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {name}")
    return found


def test_sqlalchemy_private_names_are_used_in_the_fence_module_only() -> None:
    fence = Path(sqla_private.__file__).resolve()
    found = [
        use
        for path in sorted((ROOT / "sqla_queue").rglob("*.py"))
        if path.resolve() != fence
        for use in _private_uses(path)
    ]
    assert not found, (
        "SQLAlchemy's private API outside sqla_queue/adapters/sqla_private.py "
        "(add a function there and call it): " + "; ".join(found)
    )
