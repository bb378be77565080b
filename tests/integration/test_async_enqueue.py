"""Enqueue from async code (docs/async.md): ``install()`` on an
AsyncSession class, an ``async_sessionmaker`` or an AsyncSession, and
``AsyncQueueClient``, on real SQLite (aiosqlite), PostgreSQL (psycopg's
async mode) and MariaDB (asyncmy, the ``mysql`` extra's driver; aiomysql
in one test of its own).

An AsyncSession flushes through a plain Session in a greenlet, so the
tests hold the async path to the sync one: the same rows for the same
task, the same results and errors from each client method; and the tasks
are then consumed by the ordinary sync worker. Each test runs its
coroutine with ``asyncio.run`` and disposes of its async engine in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import Engine, create_engine, event, func, insert, inspect, select, text
from sqlalchemy.exc import DataError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

import sqla_queue.enqueue.events
from sqla_queue import (
    AsyncQueueClient,
    ConfigurationError,
    DuplicateTaskError,
    InvalidTaskError,
    NotInstalledError,
    QueueClient,
    TaskStateError,
    UnsupportedOperationError,
    duplicate_of,
    install,
    uninstall,
)
from sqla_queue.config.settings import Settings
from tests.conftest import ROOT, created_engine
from tests.support.app import App
from tests.support.unique_app import build as build_unique

UTC = dt.timezone.utc
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
postgresql_only = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)

# what the hook and the clients write, compared between the sync and the
# async path (the ids and the database's clock aside)
COMPARED = (
    "origem, destino, processo, chave_externa, tentativa, status, payload, payload_hash, "
    "tenant, grupo_empresarial, prioridade, pub_sub, dead, mensagem"
)
_ASYNC_DRIVERS = {"mysql+pymysql": "mysql+asyncmy", "sqlite": "sqlite+aiosqlite"}


def async_url(engine: Engine, drivername: str | None = None) -> str:
    """``engine``'s database through the async driver users name in their
    URL (psycopg: SQLAlchemy picks its async dialect), or ``drivername``."""
    url = engine.url
    if drivername is None:
        drivername = {"sqlite+pysqlite": "sqlite"}.get(url.drivername, url.drivername)
        drivername = _ASYNC_DRIVERS.get(drivername, drivername)
    return url.set(drivername=drivername).render_as_string(hide_password=False)


@contextlib.asynccontextmanager
async def async_engine(engine: Engine, drivername: str | None = None) -> AsyncIterator[AsyncEngine]:
    aengine = create_async_engine(async_url(engine, drivername))
    try:
        yield aengine
    finally:
        await aengine.dispose()


def run(
    engine: Engine, body: Callable[[AsyncEngine], Awaitable[Any]], drivername: str | None = None
) -> Any:
    """``body(async engine)`` on ``engine``'s database, in an event loop of its own."""

    async def main() -> Any:
        async with async_engine(engine, drivername) as aengine:
            return await body(aengine)

    return asyncio.run(main())


def _raw(engine: Engine, table: str, columns: str = COMPARED) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {columns} FROM {table} ORDER BY id"))
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]


def _count(engine: Engine, model: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


def _statuses(engine: Engine, app: App) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(app.Task.status).order_by(app.Task.id)).scalars())


def drain(worker: Any, engine: Engine) -> None:
    assert worker().run(engine=engine, burst=True, settings=Settings()) == 0


@pytest.fixture
def not_installed() -> Iterator[None]:
    """No hook on the Session class before, and none left after."""
    assert not event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush)
    try:
        yield
    finally:
        uninstall()


@pytest.fixture
def async_installed(not_installed: None) -> Iterator[None]:
    install(AsyncSession)
    yield


# ------------------------------------------------------------ the ORM path
def test_commit_enqueues_the_task_with_the_business_row(
    engine: Engine, app: App, async_installed: None
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            session.add(app.Effect(task_id=0, chain_id=0, note="business"))
            session.add(app.Task(process="faturar", payload={"invoice": 7}, external_key="7"))
            await session.commit()

    run(engine, body)
    assert _raw(engine, app.Task.__tablename__, "processo, chave_externa, status, payload") == [
        ("faturar", "7", "pendente", '{"invoice": 7}')
    ]
    assert _count(engine, app.Effect) == 1


def test_rollback_leaves_neither_the_task_nor_the_business_row(
    engine: Engine, app: App, async_installed: None
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            session.add(app.Effect(task_id=0, chain_id=0, note="business"))
            session.add(app.Task(process="faturar", payload={"invoice": 8}))
            await session.flush()
            assert await session.scalar(select(func.count()).select_from(app.Task)) == 1
            await session.rollback()

    run(engine, body)
    assert _count(engine, app.Task) == 0
    assert _count(engine, app.Effect) == 0


@pytest.mark.parametrize("fast_insert", ["true", "false"])
def test_the_rows_are_those_the_sync_hook_writes(
    engine: Engine,
    app: App,
    async_installed: None,
    fast_insert: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the fast writer (flush_insert.py) and with the ORM's unit of work."""
    monkeypatch.setenv("SQLA_QUEUE_ORM_FAST_INSERT", fast_insert)
    later = (dt.datetime.now(UTC) + dt.timedelta(hours=2)).replace(microsecond=0)

    def tasks() -> list[Any]:
        return [
            app.Task(
                process="faturar",
                payload={"invoice": 7, "itens": ["a", "ç"]},
                priority=80,
                external_key="7",
                origin="erp",
                destination="sefaz",
                tenant=47,
                company_group="G1",
            ),
            app.Task(process="lembrar", payload="texto", run_at=later),
            app.Task(process="vazio"),
        ]

    with Session(engine) as session, session.begin():
        session.add_all(tasks())

    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            session.add_all(tasks())

    run(engine, body)
    rows = _raw(engine, app.Task.__tablename__, f"{COMPARED}, data_hora, data_hora_inicial")
    sync, from_async = rows[:3], rows[3:]
    assert [row[:-2] for row in from_async] == [row[:-2] for row in sync]
    assert [row[5] for row in from_async] == ["pendente", "agendada", "pendente"]
    assert from_async[1][-2:] == sync[1][-2:]


def test_the_fast_writer_writes_tasks_added_to_an_async_session(
    engine: Engine, app: App, async_installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[bool] = []
    real = sqla_queue.enqueue.events._fast_writer

    def spy(session: Session, tasks: list[Any]) -> None:
        real(session, tasks)
        written.extend(inspect(task).key is not None for task in tasks)

    monkeypatch.setattr(sqla_queue.enqueue.events, "_fast_writer", spy)

    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            session.add(app.Task(process="p", payload={"n": 1}))

    run(engine, body)
    assert written == [True]
    assert _count(engine, app.Task) == 1


def test_the_orm_bulk_insert_is_prepared_as_in_sync_code(
    engine: Engine, app: App, async_installed: None
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            await session.execute(
                insert(app.Task), [{"process": "p", "payload": {"n": n}} for n in range(2)]
            )

    run(engine, body)
    with Session(engine) as session, session.begin():
        QueueClient(session, app.Task).insert_tasks(
            [{"process": "p", "payload": {"n": n}} for n in range(2)]
        )
    rows = _raw(engine, app.Task.__tablename__)
    assert rows[:2] == rows[2:]


def test_the_task_id_after_commit_or_flush(engine: Engine, app: App, async_installed: None) -> None:
    """What users do: expire_on_commit=False, or the id read after a flush,
    or a refresh after the commit (the default maker expires everything)."""

    async def body(aengine: AsyncEngine) -> list[tuple[int, str]]:
        seen = []
        kept = async_sessionmaker(aengine, expire_on_commit=False)
        async with kept() as session:
            task = app.Task(process="p", payload={"n": 1})
            session.add(task)
            await session.commit()
            seen.append((task.id, task.status))
        async with async_sessionmaker(aengine)() as session:
            task = app.Task(process="p", payload={"n": 2})
            session.add(task)
            await session.flush()
            seen.append((task.id, task.status))
            await session.commit()
            await session.refresh(task)
            seen.append((task.id, task.status))
        return seen

    seen = run(engine, body)
    with engine.connect() as conn:
        ids = list(conn.execute(select(app.Task.id).order_by(app.Task.id)).scalars())
    assert seen == [(ids[0], "pendente"), (ids[1], "pendente"), (ids[1], "pendente")]


def test_unique_tasks_are_admitted_in_an_async_session(
    db_url: str, table_name: str, not_installed: None
) -> None:
    base, task, _ = build_unique(table_name)
    with created_engine(db_url, base.metadata) as engine:

        async def body(aengine: AsyncEngine) -> tuple[int, Any, Any]:
            sessions = async_sessionmaker(aengine, expire_on_commit=False)
            install(sessions)
            async with sessions() as session, session.begin():
                first = task(process="pular", external_key="nf-1", payload={"n": 1})
                session.add(first)
            async with sessions() as session, session.begin():
                again = task(process="pular", external_key="nf-1", payload={"n": 2})
                session.add(again)
                await session.flush()
                assert again not in session
            async with sessions() as session:
                session.add(task(process="recusar", external_key="r", payload={}))
                await session.commit()
                session.add(task(process="recusar", external_key="r", payload={}))
                with pytest.raises(DuplicateTaskError, match="policy 'error'"):
                    await session.flush()
                await session.rollback()
            return first.id, duplicate_of(again), again.id

        first_id, duplicate, again_id = run(engine, body)
        assert (duplicate, again_id) == (first_id, None)
        assert _raw(engine, table_name, "processo, payload") == [
            ("pular", '{"n": 1}'),
            ("recusar", "{}"),
        ]


# ------------------------------------------------- install and uninstall
@sqlite_only
def test_install_on_the_async_session_class_is_install_on_session(
    engine: Engine, app: App, not_installed: None
) -> None:
    install(AsyncSession)
    assert event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush)

    async def add(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            session.add(app.Task(process="p", payload={"k": 1}))
            await session.commit()

    run(engine, add)
    uninstall(AsyncSession)
    assert not event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush)
    with pytest.raises(NotInstalledError):
        run(engine, add)
    assert _count(engine, app.Task) == 1


@sqlite_only
def test_install_on_an_async_sessionmaker_reaches_only_its_sessions(
    engine: Engine, app: App, not_installed: None
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        sessions = async_sessionmaker(aengine)
        other = async_sessionmaker(aengine)
        install(sessions)
        install(sessions)
        async with sessions() as session, session.begin():
            session.add(app.Task(process="maker", payload={"k": 1}))
        for unhooked in (other(), AsyncSession(aengine)):
            async with unhooked as session:
                session.add(app.Task(process="other", payload={"k": 2}))
                with pytest.raises(NotInstalledError):
                    await session.flush()
        uninstall(sessions)
        async with sessions() as session:
            session.add(app.Task(process="after uninstall", payload={"k": 3}))
            with pytest.raises(NotInstalledError):
                await session.flush()

    run(engine, body)
    with Session(engine) as session:
        session.add(app.Task(process="sync", payload={"k": 4}))
        with pytest.raises(NotInstalledError):
            session.flush()
    assert _raw(engine, app.Task.__tablename__, "processo") == [("maker",)]


@sqlite_only
def test_install_on_an_async_sessionmaker_with_its_own_sync_session_class(
    engine: Engine, app: App, not_installed: None
) -> None:
    class Routing(Session):
        pass

    sync_maker = sessionmaker()

    async def body(aengine: AsyncEngine) -> None:
        for sync in (Routing, sync_maker):
            sessions = async_sessionmaker(aengine, sync_session_class=sync)
            install(sessions)
            assert event.contains(sync, "before_flush", sqla_queue.enqueue.events._before_flush)
            async with sessions() as session, session.begin():
                session.add(app.Task(process="p", payload={"k": 1}))
            uninstall(sessions)
            assert not event.contains(sync, "before_flush", sqla_queue.enqueue.events._before_flush)

    run(engine, body)
    assert _count(engine, app.Task) == 2


@sqlite_only
def test_install_on_one_async_session(engine: Engine, app: App, not_installed: None) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            install(session)
            session.add(app.Task(process="p", payload={"k": 1}))
            await session.commit()
            uninstall(session)
            session.add(app.Task(process="p", payload={"k": 2}))
            with pytest.raises(NotInstalledError):
                await session.flush()
            await session.rollback()
        async with AsyncSession(aengine) as other:
            other.add(app.Task(process="p", payload={"k": 3}))
            with pytest.raises(NotInstalledError):
                await other.flush()

    run(engine, body)
    assert _raw(engine, app.Task.__tablename__, "payload") == [('{"k": 1}',)]


@sqlite_only
def test_without_install_a_flush_and_an_orm_insert_are_refused(
    engine: Engine, app: App, not_installed: None
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            session.add(app.Task(process="p", payload={"k": 1}))
            with pytest.raises(NotInstalledError):
                await session.commit()
            await session.rollback()
            with pytest.raises(NotInstalledError):
                await session.execute(insert(app.Task), [{"process": "p"}])

    run(engine, body)
    assert _count(engine, app.Task) == 0


def test_a_listener_two_targets_share_stays_until_both_are_uninstalled(
    not_installed: None,
) -> None:
    install(Session)
    install(AsyncSession)
    uninstall(AsyncSession)
    assert event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush)
    install(AsyncSession)
    uninstall(Session)
    assert event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush)
    uninstall(AsyncSession)
    assert not event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush)


@sqlite_only
def test_a_session_two_installs_reach_prepares_each_task_once(
    engine: Engine, app: App, not_installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install(AsyncSession) is on Session, install(maker) on the maker's
    own subclass of it: both listeners are called for one flush."""
    calls: list[str] = []
    real = sqla_queue.enqueue.events.prepare_task
    monkeypatch.setattr(
        sqla_queue.enqueue.events,
        "prepare_task",
        lambda task: (calls.append(task.process), real(task)),
    )

    async def body(aengine: AsyncEngine) -> None:
        sessions = async_sessionmaker(aengine)
        install(AsyncSession)
        install(sessions)
        async with sessions() as session, session.begin():
            session.add(app.Task(process="once", payload={"k": 1}))

    run(engine, body)
    assert calls == ["once"]


def test_import_sqla_queue_and_sync_enqueue_need_no_greenlet(tmp_path: Path) -> None:
    """Greenlet made unimportable, as if not installed: the sync path works,
    sqlalchemy.ext.asyncio is never imported, and AsyncQueueClient says
    which extra brings what it needs."""
    script = textwrap.dedent(
        """
        import sys

        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "greenlet":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NotInstalled())
        from sqlalchemy import create_engine, func, select
        from sqlalchemy.orm import Session
        from sqla_queue import QueueClient, install
        from tests.support.app import build

        app = build("fila")
        engine = create_engine("sqlite://")
        app.Base.metadata.create_all(engine)
        install(Session)
        with Session(engine) as session, session.begin():
            session.add(app.Task(process="p", payload={"n": 1}))
            QueueClient(session, app.Task).insert_task(processo="q")
        with Session(engine) as session:
            print(session.scalar(select(func.count()).select_from(app.Task)))
        print("sqlalchemy.ext.asyncio" in sys.modules)
        try:
            from sqla_queue import AsyncQueueClient
        except ImportError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    count, imported, *message = done.stdout.splitlines()
    assert (count, imported) == ("2", "False")
    if sqlalchemy.__version__.startswith("2.0."):
        return  # 2.0 requires greenlet itself, and its asyncio extension imports without it
    assert "greenlet" in message[0] and "pip install 'sqla-queue[postgresql]'" in message[0]


# ------------------------------------------------------- AsyncQueueClient
def test_insert_task_returns_the_id_of_the_row_the_sync_client_writes(
    engine: Engine, app: App
) -> None:
    later = (dt.datetime.now(UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("insert_task", ("erp", "sefaz", "faturar", "7", {"invoice": 7}, 47, "G1"), {}),
        ("insert_task", (), {"process": "lembrar", "payload": [1, 2], "run_at": later}),
        ("insert_task_pub_sub", (), {"processo": "evento", "payload": {"n": 1}}),
        ("insert_task_webhook", (), {"processo": "gancho", "prioridade": 90}),
    ]
    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task)
        sync_ids = [getattr(client, name)(*args, **kwargs) for name, args, kwargs in calls]

    async def body(aengine: AsyncEngine) -> list[int]:
        async with AsyncSession(aengine) as session, session.begin():
            aclient = AsyncQueueClient(session, app.Task)
            return [await getattr(aclient, name)(*args, **kwargs) for name, args, kwargs in calls]

    async_ids = run(engine, body)
    assert all(isinstance(task_id, int) for task_id in async_ids)
    table = app.Task.__tablename__
    rows = dict(
        zip(sync_ids + async_ids, _raw(engine, table, f"{COMPARED}, data_hora"), strict=True)
    )
    with engine.connect() as conn:
        stored = list(conn.execute(select(app.Task.id).order_by(app.Task.id)).scalars())
    assert stored == sync_ids + async_ids
    for sync_id, async_id in zip(sync_ids, async_ids, strict=True):
        assert rows[async_id][:-1] == rows[sync_id][:-1]
    assert rows[async_ids[1]][-1] == rows[sync_ids[1]][-1]
    assert [rows[i][5] for i in async_ids] == ["pendente", "agendada", "pendente", "pendente"]
    assert [rows[i][11] for i in async_ids] == [False, False, True, True]


def test_insert_tasks_and_the_business_row_commit_or_roll_back_together(
    engine: Engine, app: App
) -> None:
    """Past COPY_THRESHOLD rows (64) PostgreSQL's insert_tasks uses COPY,
    through psycopg's async connection here."""
    batch = [
        {"process": "p", "external_key": str(n), "payload": {"n": n}, "prioridade": n}
        for n in range(70)
    ]

    async def body(aengine: AsyncEngine) -> tuple[list[int], list[int]]:
        async with AsyncSession(aengine) as session:
            session.add(app.Effect(task_id=0, chain_id=0, note="rolled back"))
            await AsyncQueueClient(session, app.Task).insert_tasks(batch[:3])
            await session.rollback()
        async with AsyncSession(aengine) as session, session.begin():
            session.add(app.Effect(task_id=0, chain_id=0, note="business"))
            client = AsyncQueueClient(session, app.Task)
            few = await client.insert_tasks(batch[:3], pub_sub=True)
            many = await client.insert_tasks(iter(batch))
        return few, many

    few, many = run(engine, body)
    assert len(few) == 3 and len(many) == 70
    with engine.connect() as conn:
        stored = conn.execute(
            select(app.Task.id, app.Task.priority, app.Task.pub_sub).order_by(app.Task.id)
        ).all()
    assert [tuple(row) for row in stored] == [
        *((i, n, True) for i, n in zip(few, range(3), strict=True)),
        *((i, n, False) for i, n in zip(many, range(70), strict=True)),
    ]
    assert _raw(engine, f"{app.Task.__tablename__}_effect", "note") == [("business",)]
    with Session(engine) as session, session.begin():
        QueueClient(session, app.Task).insert_tasks(batch)
    rows = _raw(engine, app.Task.__tablename__)
    assert rows[3:73] == rows[73:]


def test_copy_tasks_as_the_sync_client_copies_or_refuses(engine: Engine, app: App) -> None:
    tasks = [{"process": "p", "payload": {"n": n}} for n in range(3)]

    async def body(aengine: AsyncEngine) -> list[int]:
        async with aengine.begin() as conn:
            return await AsyncQueueClient(conn, app.Task).copy_tasks(tasks)

    if engine.dialect.name != "postgresql":
        with pytest.raises(UnsupportedOperationError, match="COPY"):
            run(engine, body)
        assert _count(engine, app.Task) == 0
        return
    ids = run(engine, body)
    with engine.begin() as conn:
        QueueClient(conn, app.Task).copy_tasks(tasks)
    rows = _raw(engine, app.Task.__tablename__, f"id, {COMPARED}")
    assert [row[0] for row in rows[:3]] == ids
    assert [row[1:] for row in rows[:3]] == [row[1:] for row in rows[3:]]


@postgresql_only
def test_a_copy_error_is_a_sqlalchemy_error_as_in_sync_code(engine: Engine, app: App) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with aengine.connect() as conn:
            client = AsyncQueueClient(conn, app.Task)
            with pytest.raises(DataError, match="cannot contain NUL"):
                await client.copy_tasks([{"process": "p", "payload": "a\x00b"}])

    run(engine, body)
    assert _count(engine, app.Task) == 0


def test_an_async_connection_commits_or_rolls_back_the_tasks(engine: Engine, app: App) -> None:
    async def body(aengine: AsyncEngine) -> int:
        async with aengine.connect() as conn:
            client = AsyncQueueClient(conn, app.Task)
            await client.insert_task(processo="rolled back")
            await conn.rollback()
            task_id = await client.insert_task(processo="committed", payload={"n": 1})
            assert await client.connection() is conn
            await conn.commit()
        return task_id

    task_id = run(engine, body)
    assert _raw(engine, app.Task.__tablename__, "id, processo") == [(task_id, "committed")]


def test_list_equivalent_task_finds_what_the_sync_client_finds(engine: Engine, app: App) -> None:
    seed = ("erp", "sefaz", "faturar", "7", {"invoice": 7})
    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task)
        client.insert_task(*seed)
        client.insert_task(*seed[:4], {"invoice": 8})
        client.insert_task(*seed, tenant=2)
        expected = [
            client.list_equivalent_task(*seed),
            client.list_equivalent_task(*seed, status=["sucesso"]),
            client.list_equivalent_task(*seed, tenant=2),
        ]

    async def body(aengine: AsyncEngine) -> list[Any]:
        async with AsyncSession(aengine) as session:
            aclient = AsyncQueueClient(session, app.Task)
            return [
                await aclient.list_equivalent_task(*seed),
                await aclient.list_equivalent_task(*seed, status=["sucesso"]),
                await aclient.list_equivalent_task(*seed, tenant=2),
            ]

    found = run(engine, body)
    assert found == expected
    assert [len(records) for records in found] == [1, 0, 1]


def test_cancel_cancel_process_and_retry_now_act_as_the_sync_client(
    engine: Engine, app: App
) -> None:
    later = dt.datetime.now(UTC) + dt.timedelta(days=3)
    long_ago = dt.datetime.now(UTC) - dt.timedelta(hours=2)

    def enqueue_set() -> dict[str, int]:
        with Session(engine) as session, session.begin():
            client = QueueClient(session, app.Task)
            return {
                "waiting": client.insert_task(processo="a", payload={}),
                "scheduled": client.insert_task(processo="b", data_hora=later),
                "old": client.insert_task(processo="c", data_hora=long_ago),
            }

    def act_sync(ids: dict[str, int]) -> list[Any]:
        with Session(engine) as session, session.begin():
            client = QueueClient(session, app.Task)
            return [
                client.cancel(ids["waiting"]),
                client.retry_now(ids["scheduled"]),
                client.cancel_process("c", older_than=dt.timedelta(hours=1)),
                client.cancel_process("c", older_than=dt.timedelta(hours=1)),
            ]

    sync_ids = enqueue_set()
    sync_results = act_sync(sync_ids)
    async_ids = enqueue_set()

    async def body(aengine: AsyncEngine) -> list[Any]:
        async with AsyncSession(aengine) as session, session.begin():
            client = AsyncQueueClient(session, app.Task)
            results = [
                await client.cancel(async_ids["waiting"]),
                await client.retry_now(async_ids["scheduled"]),
                await client.cancel_process("c", older_than=dt.timedelta(hours=1)),
                await client.cancel_process("c", older_than=dt.timedelta(hours=1)),
            ]
            with pytest.raises(TaskStateError, match="no pending or scheduled attempt"):
                await client.cancel(async_ids["waiting"])
            with pytest.raises(TaskStateError, match="no scheduled attempt"):
                await client.retry_now(async_ids["scheduled"])
            return results

    async_results = run(engine, body)
    assert sync_results == [
        [sync_ids["waiting"]],
        sync_ids["scheduled"],
        [sync_ids["old"]],
        [],
    ]
    assert async_results == [
        [async_ids["waiting"]],
        async_ids["scheduled"],
        [async_ids["old"]],
        [],
    ]
    rows = _raw(engine, app.Task.__tablename__)
    assert rows[3:] == rows[:3]
    assert [row[5] for row in rows[3:]] == ["falha", "pendente", "falha"]


def test_requeue_dead_requeues_as_the_sync_client(engine: Engine, app: App) -> None:
    class Once(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task)
        sync_id = client.insert_task(processo="p", payload={"fail": "dead"})
        async_id = client.insert_task(processo="p", payload={"fail": "dead"})
    drain(Once, engine)
    with Session(engine) as session, session.begin():
        preview = QueueClient(session, app.Task).requeue_dead([sync_id], dry_run=True)
        [done] = QueueClient(session, app.Task).requeue_dead([sync_id])

    async def body(aengine: AsyncEngine) -> tuple[Any, Any, Any]:
        async with AsyncSession(aengine) as session, session.begin():
            client = AsyncQueueClient(session, app.Task)
            apreview = await client.requeue_dead([async_id], dry_run=True)
            [adone] = await client.requeue_dead([async_id], process="p")
            again = await client.requeue_dead(all_dead=True)
            return apreview, adone, again

    apreview, adone, again = run(engine, body)
    assert [(r.live_id, r.new_id) for r in preview] == [(sync_id, None)]
    assert [(r.live_id, r.new_id) for r in apreview] == [(async_id, None)]
    assert (done.live_id, adone.live_id, again) == (sync_id, async_id, [])
    with Session(engine) as session:
        new = session.get(app.Task, adone.new_id)
        assert new is not None
        assert (new.status, new.live_id, new.payload) == ("pendente", async_id, {"fail": "dead"})


def test_unique_tasks_through_async_queue_client(db_url: str, table_name: str) -> None:
    base, task, _ = build_unique(table_name)
    with created_engine(db_url, base.metadata) as engine:

        async def body(aengine: AsyncEngine) -> tuple[int, int, list[int]]:
            async with AsyncSession(aengine) as session, session.begin():
                client = AsyncQueueClient(session, task)
                first = await client.insert_task(processo="pular", chave_externa="k", payload={})
                await client.insert_task(processo="recusar", chave_externa="r", payload={})
            async with AsyncSession(aengine) as session, session.begin():
                client = AsyncQueueClient(session, task)
                again = await client.insert_task(processo="pular", chave_externa="k", payload={})
                batch = await client.insert_tasks(
                    [{"processo": "pular", "chave_externa": "k"}, {"processo": "pular"}]
                )
            async with AsyncSession(aengine) as session:
                client = AsyncQueueClient(session, task)
                with pytest.raises(DuplicateTaskError, match="policy 'error'"):
                    await client.insert_task(processo="recusar", chave_externa="r", payload={})
            return first, again, batch

        first, again, batch = run(engine, body)
        assert again == first and batch[0] == first and batch[1] != first
        assert _count(engine, task) == 3


def test_bad_arguments_raise_the_sync_clients_errors(engine: Engine, app: App) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            client = AsyncQueueClient(session, app.Task)
            with pytest.raises(TypeError, match="unexpected argument 'queue'"):
                await client.insert_task(process="p", queue="x")
            with pytest.raises(TypeError, match="given twice"):
                await client.insert_task("o", "d", "p", processo="p")
            with pytest.raises(InvalidTaskError, match=r"^prioridade \(priority\): ") as caught:
                await client.insert_task(process="p", priority="urgent")
            assert "\n" not in str(caught.value)
            await session.rollback()

    run(engine, body)
    assert _count(engine, app.Task) == 0


@sqlite_only
def test_the_constructor_takes_the_sync_clients_arguments(
    engine: Engine, app: App, table_name: str
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            client = AsyncQueueClient(bd_conn=session, queue_table=table_name)
            assert (client.bd_conn, client.table.name) == (session, table_name)
            assert await client.connection() is await session.connection()
            await client.insert_task(processo="by name")
            with pytest.raises(TypeError, match=r"AsyncQueueClient\(\) got both table and"):
                AsyncQueueClient(session, app.Task, queue_table=table_name)
            with pytest.raises(TypeError, match="needs an AsyncSession or AsyncConnection and"):
                AsyncQueueClient(session)
            sync_refused = r"not sqlalchemy\.orm\.session\.Session: use sqla_queue\.QueueClient"
            with pytest.raises(ConfigurationError, match=sync_refused):
                AsyncQueueClient(session.sync_session, app.Task)
            with pytest.raises(ConfigurationError, match=r"use sqla_queue\.AsyncQueueClient"):
                QueueClient(session, app.Task)  # type: ignore[arg-type]
            with pytest.raises(ConfigurationError, match="connected AsyncConnection"):
                AsyncQueueClient(aengine.connect(), app.Task)
            await session.commit()

    run(engine, body)
    assert _raw(engine, app.Task.__tablename__, "processo") == [("by name",)]


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_aiomysql_stores_and_finds_the_payload_hash(
    engine: Engine, app: App, async_installed: None
) -> None:
    """aiomysql 0.3.2 fails every bytes parameter with PyMySQL 1.2.3+
    (aio-libs/aiomysql#1080): the payload hash, the queue's one binary
    column, goes to it as the ASCII text it is."""
    pytest.importorskip("aiomysql")

    async def body(aengine: AsyncEngine) -> list[Any]:
        async with AsyncSession(aengine) as session, session.begin():
            session.add(app.Task(process="p", payload={"n": 1}))
            await session.flush()
            client = AsyncQueueClient(session, app.Task)
            await client.insert_task(processo="p", payload={"n": 1})
            await client.insert_tasks([{"processo": "p", "payload": {"n": 1}}] * 2)
            return await client.list_equivalent_task(processo="p", payload={"n": 1})

    found = run(engine, body, "mysql+aiomysql")
    with Session(engine) as session, session.begin():
        session.add(app.Task(process="p", payload={"n": 1}))
    rows = _raw(engine, app.Task.__tablename__)
    assert rows == [rows[-1]] * 5
    assert len(found) == 4


# ------------------------------------------------------ consumed by a worker
def test_tasks_enqueued_from_async_code_are_run_by_the_sync_worker(
    engine: Engine, app: App, async_installed: None
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            session.add(app.Task(process="faturar", payload={"by": "orm"}))
            client = AsyncQueueClient(session, app.Task)
            await client.insert_task(processo="faturar", payload={"by": "client"})
            await client.insert_tasks([{"processo": "faturar", "payload": {"by": "batch"}}])

    run(engine, body)
    drain(app.RecordingWorker, engine)
    assert _statuses(engine, app) == ["sucesso"] * 3
    notes = _raw(engine, f"{app.Task.__tablename__}_effect", "note")
    assert sorted(notes) == [("{'by': 'batch'}",), ("{'by': 'client'}",), ("{'by': 'orm'}",)]


# ------------------------------------------------------- the FastAPI example
@pytest.fixture
def example(
    db_url: str, monkeypatch: pytest.MonkeyPatch, not_installed: None
) -> Iterator[tuple[Any, Engine]]:
    """examples/fastapi_app.py on this database (SQLA_QUEUE_URL), its
    tables dropped after; the install it makes at startup undone."""
    from examples import fastapi_app

    engine = create_engine(db_url)
    monkeypatch.setenv("SQLA_QUEUE_URL", async_url(engine))
    try:
        yield fastapi_app, engine
    finally:
        fastapi_app.Base.metadata.drop_all(engine)
        engine.dispose()


def test_the_fastapi_example_enqueues_in_the_request_and_shows_the_status(
    example: tuple[Any, Engine],
) -> None:
    from fastapi.testclient import TestClient

    fastapi_app, engine = example
    with TestClient(fastapi_app.app) as http:
        created = http.post("/invoices", json={"customer": "ACME"})
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]
        assert http.get(f"/tasks/{task_id}").json() == {"id": task_id, "status": "pendente"}
        refused = http.post("/invoices", json={"customer": ""})
        assert refused.status_code == 422
        drain(fastapi_app.Faturar, engine)
        assert http.get(f"/tasks/{task_id}").json() == {"id": task_id, "status": "sucesso"}
        assert http.get("/tasks/987654").status_code == 404
    with engine.connect() as conn:
        invoices = conn.execute(text("SELECT customer, faturada FROM invoice")).all()
    assert [tuple(row) for row in invoices] == [("ACME", True)]
