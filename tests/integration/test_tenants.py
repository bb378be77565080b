"""Multi-database tenants: each task's work lands in its tenant's own database.

Real databases only: two tenant databases per run, created on the shared
PostgreSQL and MariaDB servers (random names, dropped at teardown) or as
SQLite files, with the queue table in the usual test database. The token
endpoint and the credentials API are a local HTTP server started by the
tests; the resolver's clock is injected, so token expiry needs no waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    String,
    create_engine,
    event,
    insert,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import (
    ConfigurationError,
    QueueClient,
    WorkerBase,
    WorkerPubSubBase,
    dead_subscriber,
    subscriber,
)
from sqla_queue.client.tenants import (
    CredentialsApiResolver,
    MappingResolver,
    TenantEngines,
    TenantError,
    UrlTemplateResolver,
    resolver_from_settings,
)
from sqla_queue.config.settings import Settings, TenantSettings, normalize_url
from sqla_queue.worker import Runner
from tests.conftest import run_cli, server_url, wait_until
from tests.integration.test_worker import drain, enqueue, tasks
from tests.support.app import App
from tests.support.pubsub_app import build as build_pubsub

TENANTS = (47, 48)


class TenantBase(DeclarativeBase):
    pass


class Ledger(TenantBase):
    """The tenant's business table: one row per task chain (the idempotency key)."""

    __tablename__ = "sqlaq_ledger"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    chain_id: Mapped[int] = mapped_column(BigInteger, unique=True)
    tenant: Mapped[int] = mapped_column(Integer)
    note: Mapped[str | None] = mapped_column(String(200))


def once_statement(dialect: str, **values: Any) -> Any:
    """An INSERT of a ledger row that does nothing when its chain_id is there."""
    if dialect == "postgresql":
        return (
            postgresql.insert(Ledger)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["chain_id"])
        )
    return (
        insert(Ledger)
        .values(**values)
        .prefix_with("OR IGNORE" if dialect == "sqlite" else "IGNORE")
    )


def insert_once(session: Session, **values: Any) -> None:
    """INSERT keyed on chain_id, doing nothing when it is there (a re-run)."""
    session.execute(once_statement(session.get_bind().dialect.name, **values))


def ledger(url: str) -> list[tuple[int, int, str | None]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(Ledger.chain_id, Ledger.tenant, Ledger.note).order_by(Ledger.id)
            )
            return [tuple(row) for row in rows]  # type: ignore[misc]
    finally:
        engine.dispose()


# -------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def _installed(installed: None) -> None:
    """Tasks are enqueued through the ORM: sqla-queue's flush hook is needed."""


@dataclass
class Tenants:
    kind: str
    queue: Engine
    #: tenant -> URL (password-free test servers)
    urls: dict[int, str]
    template: str
    #: what a credentials API would answer for each tenant's database
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)


def _make_tenants(kind: str, tmp_path: Path, app: App) -> Iterator[Tenants]:
    prefix = f"sqlaq_t{uuid.uuid4().hex[:8]}_"
    admin: Engine | None = None
    if kind == "sqlite":
        queue_url = f"sqlite:///{tmp_path / 'queue.db'}"
        template = f"sqlite:///{tmp_path}/{prefix}{{tenant}}.db"
    else:
        server = normalize_url(server_url(kind))
        queue_url = server.render_as_string(hide_password=False)
        template = (server.set(database="TENANTDB").render_as_string(hide_password=False)).replace(
            "TENANTDB", prefix + "{tenant}"
        )
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for tenant in TENANTS:
                conn.execute(text(f"CREATE DATABASE {prefix}{tenant}"))
    urls = {tenant: template.format(tenant=tenant) for tenant in TENANTS}
    parts = {}
    for tenant, url in urls.items():
        engine = create_engine(url)
        TenantBase.metadata.create_all(engine)
        engine.dispose()
        parsed = normalize_url(url)
        parts[tenant] = {
            "hostname": parsed.host,
            "port": parsed.port,
            "db_name": parsed.database,
            "user": parsed.username,
        }
    queue = create_engine(queue_url)
    app.Base.metadata.create_all(queue)
    try:
        yield Tenants(kind, queue, urls, template, parts)
    finally:
        app.Base.metadata.drop_all(queue)
        queue.dispose()
        if admin is not None:
            with admin.connect() as conn:
                for tenant in TENANTS:
                    force = " WITH (FORCE)" if kind == "postgresql" else ""
                    conn.execute(text(f"DROP DATABASE IF EXISTS {prefix}{tenant}{force}"))
            admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def tenants(request: pytest.FixtureRequest, tmp_path: Path, app: App) -> Iterator[Tenants]:
    """Two tenant databases on each kind of server, and the queue in the test one."""
    yield from _make_tenants(request.param, tmp_path, app)


@pytest.fixture
def pg_tenants(tmp_path: Path, app: App) -> Iterator[Tenants]:
    yield from _make_tenants("postgresql", tmp_path, app)


@pytest.fixture
def sqlite_tenants(tmp_path: Path, app: App) -> Iterator[Tenants]:
    yield from _make_tenants("sqlite", tmp_path, app)


def worker_for(app: App, resolver: Any, **attributes: Any) -> type[WorkerBase]:
    class TenantWorker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        tenant_resolver = resolver

        def execute(  # type: ignore[override]
            self, payload: Any, task: Any, session: Session, tenant_session: Session
        ) -> str | None:
            # the queue's session still writes to the queue database
            session.add(app.Effect(task_id=task.id, chain_id=task.chain_id, note="queue"))
            insert_once(
                tenant_session, chain_id=task.chain_id, tenant=task.tenant, note=str(payload)
            )
            if isinstance(payload, dict) and payload.get("fail"):
                raise RuntimeError("asked to fail")
            return f"tenant {task.tenant}"

        def execute_dead(  # type: ignore[override]
            self, payload: Any, task: Any, session: Session, tenant_session: Session
        ) -> str | None:
            return "dead handled"

    for name, value in attributes.items():
        setattr(TenantWorker, name, value)
    return TenantWorker


# --------------------------------------------------------- the tenant's database
def test_tasks_write_to_their_tenants_own_database(tenants: Tenants, app: App) -> None:
    ids = [
        enqueue(tenants.queue, app, {"n": n}, tenant=tenant)[0]
        for n, tenant in enumerate((47, 48, 47))
    ]
    worker = worker_for(app, UrlTemplateResolver(tenants.template))
    drain(worker, tenants.queue, concurrency=2)

    assert [(t.id, t.status, t.message) for t in tasks(tenants.queue, app)] == [
        (ids[0], "sucesso", "tenant 47"),
        (ids[1], "sucesso", "tenant 48"),
        (ids[2], "sucesso", "tenant 47"),
    ]
    # two lanes: the order of the two tenant-47 writes is the lanes' race
    assert sorted(ledger(tenants.urls[47])) == [
        (ids[0], 47, "{'n': 0}"),
        (ids[2], 47, "{'n': 2}"),
    ]
    assert ledger(tenants.urls[48]) == [(ids[1], 48, "{'n': 1}")]
    # the queue database has the queue session's writes, and no tenant table
    with tenants.queue.connect() as conn:
        assert conn.execute(select(app.Effect.note)).scalars().all() == ["queue"] * 3
        assert not conn.dialect.has_table(conn, Ledger.__tablename__)


def test_a_failing_handler_rolls_back_its_tenant_writes(tenants: Tenants, app: App) -> None:
    failing, fine = enqueue(tenants.queue, app, {"fail": True}, {"ok": 1}, tenant=48)
    worker = worker_for(app, UrlTemplateResolver(tenants.template), max_retry=1)
    drain(worker, tenants.queue)

    rows = {t.id: t for t in tasks(tenants.queue, app)}
    assert rows[failing].status == "falha"
    assert rows[failing].message.startswith("RuntimeError: asked to fail")
    assert rows[fine].status == "sucesso"
    assert ledger(tenants.urls[48]) == [(fine, 48, "{'ok': 1}")]


def async_worker_for(app: App, resolver: Any, **attributes: Any) -> type[WorkerBase]:
    """:func:`worker_for` with coroutine handlers: the tenant session is an
    AsyncSession on the tenant's database."""

    class AsyncTenantWorker(WorkerBase):
        model = app.Task
        retry_interval_minutes = 0
        tenant_resolver = resolver

        async def execute(  # type: ignore[override]
            self, payload: Any, task: Any, session: Any, tenant_session: Any
        ) -> str | None:
            assert isinstance(tenant_session, AsyncSession)
            session.add(app.Effect(task_id=task.id, chain_id=task.chain_id, note="queue"))
            dialect = tenant_session.get_bind().dialect.name
            await tenant_session.execute(
                once_statement(
                    dialect, chain_id=task.chain_id, tenant=task.tenant, note=str(payload)
                )
            )
            await asyncio.sleep(0)  # another lane's handler may run meanwhile
            if isinstance(payload, dict) and payload.get("fail"):
                raise RuntimeError("asked to fail")
            return f"tenant {task.tenant}"

        async def execute_dead(  # type: ignore[override]
            self, payload: Any, task: Any, session: Any, tenant_session: Any
        ) -> str | None:
            return "dead handled"

    for name, value in attributes.items():
        setattr(AsyncTenantWorker, name, value)
    return AsyncTenantWorker


def test_async_handlers_write_to_their_tenants_own_database(tenants: Tenants, app: App) -> None:
    """An async worker's tenant session: an AsyncSession on the tenant's
    database through its async driver; a failing handler's tenant writes
    roll back; the tenant engines are disposed on the loop at stop."""
    ids = [
        enqueue(tenants.queue, app, {"n": n}, tenant=tenant)[0]
        for n, tenant in enumerate((47, 48, 47))
    ]
    failing = enqueue(tenants.queue, app, {"fail": True}, tenant=48)[0]
    worker = async_worker_for(app, UrlTemplateResolver(tenants.template), max_retry=1)
    instance = worker()
    assert instance.run(engine=tenants.queue, burst=True, settings=Settings(), concurrency=2) == 0
    assert instance._tenant_engines is None  # closed at stop

    rows = {t.id: t for t in tasks(tenants.queue, app)}
    assert [(rows[i].status, rows[i].message) for i in ids] == [
        ("sucesso", "tenant 47"),
        ("sucesso", "tenant 48"),
        ("sucesso", "tenant 47"),
    ]
    assert rows[failing].status == "falha"
    assert sorted(ledger(tenants.urls[47])) == [
        (ids[0], 47, "{'n': 0}"),
        (ids[2], 47, "{'n': 2}"),
    ]
    assert ledger(tenants.urls[48]) == [(ids[1], 48, "{'n': 1}")]  # not the failed one's


def test_an_async_tenant_engine_is_replaced_when_its_url_changes(sqlite_tenants: Tenants) -> None:
    """The async engine cache: a tenant whose URL changed gets a new engine
    and the old one is disposed on the loop; aclose disposes the rest and
    later uses fail with one line."""
    urls = {47: sqlite_tenants.urls[47]}

    class Moving:  # a resolver whose answer the test changes
        def database_url(self, tenant: int) -> Any:
            return normalize_url(urls[tenant])

    engines = TenantEngines(Moving(), asynchronous=True)

    async def scenario() -> None:
        first = await engines.async_engine(47)
        async with engines.async_session(47) as session:
            assert (await session.execute(text("SELECT 1"))).scalar() == 1
        assert await engines.async_engine(47) is first
        urls[47] = sqlite_tenants.urls[48]
        second = await engines.async_engine(47)
        assert second is not first and len(engines) == 1
        await engines.aclose()
        with pytest.raises(TenantError, match="its tenant engines are closed"):
            await engines.async_engine(47)

    asyncio.run(scenario())


def test_a_rerun_after_the_tenant_commit_is_harmless_with_the_chain_id(
    sqlite_tenants: Tenants, app: App
) -> None:
    """The tenant commits, then the queue's part fails (a crash there does the
    same): the task runs again, and the insert keyed on chain_id does nothing."""
    tenants = sqlite_tenants
    [task_id] = enqueue(tenants.queue, app, {"n": 1}, tenant=47)
    runs: list[int] = []

    class Worker(worker_for(app, UrlTemplateResolver(tenants.template))):  # type: ignore[misc]
        def execute(  # type: ignore[override]
            self, payload: Any, task: Any, session: Session, tenant_session: Session
        ) -> str | None:
            runs.append(task.chain_id)
            insert_once(tenant_session, chain_id=task.chain_id, tenant=47, note="once")
            if len(runs) == 1:
                # flushed by the queue's savepoint commit, after the tenant's commit
                session.add(app.Effect(id=1, task_id=0, chain_id=0, note="x"))
                session.add(app.Effect(id=1, task_id=0, chain_id=0, note="duplicate"))
            return None

    drain(Worker, tenants.queue)
    assert runs == [task_id, task_id]
    assert [(t.status, t.initial_id or t.id) for t in tasks(tenants.queue, app)] == [
        ("falha", task_id),
        ("sucesso", task_id),
    ]
    assert ledger(tenants.urls[47]) == [(task_id, 47, "once")]


def test_a_task_without_tenant_fails_clearly(sqlite_tenants: Tenants, app: App) -> None:
    enqueue(sqlite_tenants.queue, app, {"n": 1})
    worker = worker_for(app, UrlTemplateResolver(sqlite_tenants.template), max_retry=1)
    drain(worker, sqlite_tenants.queue)
    [row, _dead] = tasks(sqlite_tenants.queue, app)
    assert row.status == "falha"
    assert row.message.startswith("TenantError: the task has no tenant")


def test_an_unknown_tenant_of_a_mapping_fails_clearly(sqlite_tenants: Tenants, app: App) -> None:
    enqueue(sqlite_tenants.queue, app, {"n": 1}, tenant=49)
    resolver = MappingResolver({47: sqlite_tenants.urls[47]})
    drain(worker_for(app, resolver, max_retry=1), sqlite_tenants.queue)
    row = tasks(sqlite_tenants.queue, app)[0]
    assert row.message.startswith("TenantError: no database is configured for tenant 49")


# --------------------------------------------------------------- configuration
def test_a_four_parameter_handler_is_refused_at_start(app: App, tmp_path: Path) -> None:
    resolver = UrlTemplateResolver(f"sqlite:///{tmp_path}/t_{{tenant}}.db")

    class Plain(app.RecordingWorker):  # type: ignore[name-defined,misc]
        tenant_resolver = resolver

    with pytest.raises(ConfigurationError) as caught:
        Plain.check_configuration()
    assert str(caught.value) == (
        "Plain.execute must take (self, payload, task, session, tenant_session) "
        "in multi-database mode"
    )
    # the same through the environment: refused when the runner starts
    engine = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    app.Base.metadata.create_all(engine)
    settings = Settings(
        tenants=TenantSettings(multi_database=True, url_template=f"sqlite:///{tmp_path}/{{tenant}}")
    )
    with pytest.raises(ConfigurationError, match=r"RecordingWorker\.execute must take"):
        Runner.for_worker(app.RecordingWorker(), engine=engine, burst=True, settings=settings)
    # off: four parameters are right
    Runner.for_worker(app.RecordingWorker(), engine=engine, burst=True, settings=Settings())
    engine.dispose()


def test_a_five_parameter_handler_without_multi_database_is_refused_at_start(
    app: App, tmp_path: Path
) -> None:
    """Not every task failing with a TypeError, each burning an attempt."""
    worker = worker_for(app, None)
    engine = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    app.Base.metadata.create_all(engine)
    [task_id] = enqueue(engine, app, {"n": 1}, tenant=47)
    with pytest.raises(ConfigurationError) as caught:
        Runner.for_worker(worker(), engine=engine, burst=True, settings=Settings())
    assert str(caught.value) == (
        "TenantWorker.execute takes tenant_session, but multi-database mode is off: set "
        "MULTI_DATABASE=true (or the class's multi_database = True or tenant_resolver), "
        "or drop tenant_session"
    )
    [row] = tasks(engine, app)
    assert (row.id, row.status, row.attempt) == (task_id, "pendente", 1)
    engine.dispose()


def test_class_attributes_are_checked(app: App) -> None:
    class Bad(app.RecordingWorker):  # type: ignore[name-defined,misc]
        tenant_resolver = "postgresql://db/erp_{tenant}"

    with pytest.raises(ConfigurationError, match=r"Bad\.tenant_resolver must have a database_url"):
        Bad.check_configuration()

    class Both(app.RecordingWorker):  # type: ignore[name-defined,misc]
        tenant_resolver = MappingResolver({})
        multi_database = False

    with pytest.raises(ConfigurationError, match="multi_database = False"):
        Both.check_configuration()


def test_environment_variables(sqlite_tenants: Tenants, app: App) -> None:
    env = {"MULTI_DATABASE": "true", "SQLA_QUEUE_TENANT_URL_TEMPLATE": sqlite_tenants.template}
    settings = Settings.from_env(env)
    assert settings.tenants.multi_database
    assert isinstance(resolver_from_settings(settings.tenants), UrlTemplateResolver)
    enqueue(sqlite_tenants.queue, app, {"n": 1}, tenant=48)

    class EnvWorker(worker_for(app, None)):  # type: ignore[misc]
        pass

    assert EnvWorker().run(engine=sqlite_tenants.queue, burst=True, settings=settings) == 0
    assert [t.status for t in tasks(sqlite_tenants.queue, app)] == ["sucesso"]
    assert len(ledger(sqlite_tenants.urls[48])) == 1

    # the seed's misspelled name, and the right one
    api = {"MULTI_DATABASE_API_CREDETIALS_URL": "http://a/x"}
    assert TenantSettings.from_env(api).credentials_url == "http://a/x"
    api = {"MULTI_DATABASE_API_CREDENTIALS_URL": "http://b/x"}
    assert TenantSettings.from_env(api).credentials_url == "http://b/x"
    assert "secret-pw" not in repr(
        TenantSettings.from_env({"MULTI_DATABASE_PASSWORD": "secret-pw"})
    )

    errors = {
        "MULTI_DATABASE": ({"MULTI_DATABASE": "sim"}, "MULTI_DATABASE must be true or false"),
        "ttl": (
            {"SQLA_QUEUE_TENANT_CREDENTIALS_TTL": "nan"},
            "SQLA_QUEUE_TENANT_CREDENTIALS_TTL must be a number of seconds from 0 to 86400",
        ),
        "engines": ({"SQLA_QUEUE_TENANT_ENGINES": "0"}, "SQLA_QUEUE_TENANT_ENGINES must be"),
    }
    for variables, message in errors.values():
        with pytest.raises(ConfigurationError, match=message):
            Settings.from_env(variables)
    with pytest.raises(
        ConfigurationError,
        match="needs MULTI_DATABASE_USER, MULTI_DATABASE_PASSWORD, MULTI_DATABASE_CLIENT_ID",
    ):
        resolver_from_settings(TenantSettings(multi_database=True))
    with pytest.raises(ConfigurationError, match="OAUTH_TOKEN_URL must be an http"):
        resolver_from_settings(
            TenantSettings(user="u", password="p", client_id="c", token_url="ftp://x")
        )
    with pytest.raises(ConfigurationError, match="unknown tenant database driver"):
        resolver_from_settings(TenantSettings(user="u", password="p", client_id="c", driver="x"))


def test_url_template_accepts_only_a_whole_number_tenant() -> None:
    resolver = UrlTemplateResolver("postgresql://app:pw@db/erp_{tenant}")
    url = resolver.database_url(47)
    assert url.render_as_string(hide_password=False) == ("postgresql+psycopg://app:pw@db/erp_47")
    assert "pw" not in repr(url) and "pw" not in repr(resolver)
    for bad in ("47", True, 4.7, None):
        with pytest.raises(TenantError, match="a tenant must be a whole number"):
            resolver.database_url(bad)  # type: ignore[arg-type]
    for template in ("postgresql://db/erp", "postgresql://db/{tenant}_{x}", "p://{tenant!r}"):
        with pytest.raises(ConfigurationError, match=r"must contain \{tenant\} and no other field"):
            UrlTemplateResolver(template)


# ------------------------------------------------------------------ engine cache
def test_the_engine_cache_is_bounded_and_disposes_what_it_evicts(tmp_path: Path) -> None:
    urls = {n: f"sqlite:///{tmp_path}/tenant_{n}.db" for n in (1, 2, 3)}
    engines = TenantEngines(MappingResolver(urls), max_size=2)
    closed: list[int] = []

    def open_one(tenant: int) -> Engine:
        engine = engines.engine(tenant)
        event.listen(engine, "close", lambda *args: closed.append(tenant))
        with engine.connect() as conn:  # a pooled connection, checked in
            conn.execute(text("SELECT 1"))
        return engine

    first = open_one(1)
    open_one(2)
    assert engines.engine(1) is first  # a hit: 1 is now the most recent
    open_one(3)  # evicts 2, the least recently used
    assert len(engines) == 2 and closed == [2]
    assert engines.engine(1) is first
    engines.close()
    assert sorted(closed) == [1, 2, 3]
    with pytest.raises(TenantError, match="closed"):
        engines.engine(1)


def test_tenant_engines_are_disposed_when_the_worker_stops(
    sqlite_tenants: Tenants, app: App
) -> None:
    closed: list[str] = []
    base = worker_for(app, UrlTemplateResolver(sqlite_tenants.template))

    class Worker(base):  # type: ignore[misc,valid-type]
        def execute(  # type: ignore[override]
            self, payload: Any, task: Any, session: Session, tenant_session: Session
        ) -> str | None:
            engine = tenant_session.get_bind()
            if not event.contains(engine, "close", on_close):
                event.listen(engine, "close", on_close)
            return super().execute(payload, task, session, tenant_session)

    def on_close(*args: Any) -> None:
        closed.append("closed")

    enqueue(sqlite_tenants.queue, app, {"n": 1}, {"n": 2}, tenant=47)
    enqueue(sqlite_tenants.queue, app, {"n": 3}, tenant=48)
    worker = Worker()
    assert worker.run(engine=sqlite_tenants.queue, burst=True, settings=Settings()) == 0
    assert worker._tenant_engines is None
    assert len(closed) == 2  # one pooled connection per tenant, closed at stop


# ----------------------------------------------------------- the credentials API
SECRETS = {
    "password": "Pa55-account-SECRET",
    "db_password": "Db-pa55-SECRET",
}


class FakeAuth:
    """The token endpoint (/token) and the credentials API (/credentials)."""

    def __init__(self, parts: dict[int, dict[str, Any]]) -> None:
        self.parts = parts
        self.expires_in = 300
        self.refresh_expires_in = 1800
        self.credentials_status = 200
        self.token_status = 200
        self.grants: list[dict[str, str]] = []
        self.calls: list[tuple[int, str]] = []  # (tenant, bearer)
        self.headers: list[dict[str, str]] = []
        self.issued: list[str] = []
        self.lock = threading.Lock()

    def token(self, form: dict[str, str]) -> tuple[int, Any]:
        with self.lock:
            self.grants.append(form)
            n = len(self.grants)
        if self.token_status != 200:
            return self.token_status, {"error": "invalid_grant"}
        access, refresh = f"access-SECRET-{n}", f"refresh-SECRET-{n}"
        self.issued += [access, refresh]
        return 200, {
            "access_token": access,
            "expires_in": self.expires_in,
            "refresh_expires_in": self.refresh_expires_in,
            "refresh_token": refresh,
            "token_type": "Bearer",
        }

    def credentials(self, body: dict[str, Any], bearer: str) -> tuple[int, Any]:
        tenant = body["tenant"]
        with self.lock:
            self.calls.append((tenant, bearer))
        if self.credentials_status != 200:
            # an error body that echoes what it got, as some servers do
            return self.credentials_status, {"error": f"denied for {bearer}"}
        return 200, {**self.parts[tenant], "password": SECRETS["db_password"]}


@pytest.fixture
def fake_auth(request: pytest.FixtureRequest) -> Iterator[tuple[FakeAuth, str]]:
    auth = FakeAuth({})

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            auth.headers.append(dict(self.headers))
            if self.path == "/token":
                form = dict(urllib.parse.parse_qsl(raw))
                status, body = auth.token(form)
            else:
                bearer = self.headers.get("Authorization", "")
                status, body = auth.credentials(json.loads(raw), bearer)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield auth, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def api_resolver(base: str, clock: Clock | None = None, **options: Any) -> CredentialsApiResolver:
    return CredentialsApiResolver(
        user="robot@example.com",
        password=SECRETS["password"],
        client_id="erp-worker",
        token_url=f"{base}/token",
        credentials_url=f"{base}/credentials",
        clock=clock or Clock(),
        **options,
    )


def assert_no_secret(text: str, auth: FakeAuth) -> None:
    for secret in [*SECRETS.values(), *auth.issued]:
        assert secret not in text


def test_the_credentials_api_gives_each_tenant_its_database(
    pg_tenants: Tenants,
    app: App,
    fake_auth: tuple[FakeAuth, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth, base = fake_auth
    auth.parts = pg_tenants.parts
    caplog.set_level(logging.DEBUG)
    ids = [
        enqueue(pg_tenants.queue, app, {"n": n}, tenant=tenant)[0]
        for n, tenant in enumerate((47, 48, 47, 48))
    ]
    drain(worker_for(app, api_resolver(base)), pg_tenants.queue, concurrency=2)

    assert [t.status for t in tasks(pg_tenants.queue, app)] == ["sucesso"] * 4
    # two lanes: each tenant's two tasks may run in either order, never elsewhere
    assert sorted(row[0] for row in ledger(pg_tenants.urls[47])) == [ids[0], ids[2]]
    assert sorted(row[0] for row in ledger(pg_tenants.urls[48])) == [ids[1], ids[3]]
    # one password grant for every task, one credentials call per tenant (cached)
    assert auth.grants == [
        {
            "username": "robot@example.com",
            "password": SECRETS["password"],
            "client_id": "erp-worker",
            "scope": "offline_access",
            "grant_type": "password",
        }
    ]
    assert sorted(auth.calls) == [(47, "Bearer access-SECRET-1"), (48, "Bearer access-SECRET-1")]
    assert all(h.get("Accept") == "application/json" for h in auth.headers)
    for record in caplog.records:
        assert_no_secret(record.getMessage(), auth)
    for row in tasks(pg_tenants.queue, app):
        assert_no_secret(f"{row.message} {row.payload}", auth)


def test_token_refresh_then_a_new_password_grant(fake_auth: tuple[FakeAuth, str]) -> None:
    auth, base = fake_auth
    auth.parts = {
        n: {"hostname": "db", "port": 5432, "db_name": f"erp_{n}", "user": "app"} for n in TENANTS
    }
    auth.expires_in = 11  # the access token is used for 1 s: renewed 10 s early
    auth.refresh_expires_in = 30  # the refresh token for 20 s
    clock = Clock()
    resolver = api_resolver(base, clock, credentials_ttl=1, driver="MYSQL")

    url = resolver.database_url(47)  # t=0
    # any driver: here MySQL, from the same API answer
    assert url.render_as_string(hide_password=False) == (
        f"mysql+pymysql://app:{SECRETS['db_password']}@db:5432/erp_47"
    )
    assert SECRETS["db_password"] not in repr(url)
    assert resolver.database_url(47) is url  # cached: no call
    clock.now += 0.5
    resolver.database_url(48)  # the token is still valid
    clock.now += 0.4
    resolver.database_url(48)  # cached for 1 s
    assert [g["grant_type"] for g in auth.grants] == ["password"]
    assert auth.calls == [(47, "Bearer access-SECRET-1"), (48, "Bearer access-SECRET-1")]

    clock.now += 1.1  # t=2: the access token expired, the refresh token has not
    resolver.database_url(47)
    assert [g["grant_type"] for g in auth.grants] == ["password", "refresh_token"]
    assert auth.grants[1] == {
        "grant_type": "refresh_token",
        "refresh_token": "refresh-SECRET-1",
        "client_id": "erp-worker",
        "scope": "offline_access",
    }
    assert auth.calls[-1] == (47, "Bearer access-SECRET-2")

    clock.now += 30  # t=32: both expired: a new password grant
    resolver.database_url(47)
    assert [g["grant_type"] for g in auth.grants] == ["password", "refresh_token", "password"]
    assert auth.calls[-1] == (47, "Bearer access-SECRET-3")


@pytest.mark.parametrize("status", [401, 500])
def test_an_api_error_fails_the_task_without_secrets(
    sqlite_tenants: Tenants,
    app: App,
    fake_auth: tuple[FakeAuth, str],
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    auth, base = fake_auth
    auth.credentials_status = status
    caplog.set_level(logging.DEBUG)
    enqueue(sqlite_tenants.queue, app, {"n": 1}, tenant=47)
    drain(worker_for(app, api_resolver(base), max_retry=1), sqlite_tenants.queue)

    row = tasks(sqlite_tenants.queue, app)[0]
    assert row.status == "falha"
    assert row.message.startswith(
        f"TenantError: tenant 47 credentials: {base}/credentials answered HTTP {status}"
    )
    # two runs (the attempt, then its dead-letter run, which gets a tenant
    # session too); a 401 is tried once more with a new grant (a revoked token)
    assert len(auth.calls) == (4 if status == 401 else 2)
    assert len(auth.grants) == (3 if status == 401 else 1)
    for record in caplog.records:
        assert_no_secret(record.getMessage(), auth)
    for task in tasks(sqlite_tenants.queue, app):
        assert_no_secret(f"{task.message} {task.payload}", auth)


def test_a_token_endpoint_error_fails_the_task_without_secrets(
    sqlite_tenants: Tenants,
    app: App,
    fake_auth: tuple[FakeAuth, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth, base = fake_auth
    auth.token_status = 401
    caplog.set_level(logging.DEBUG)
    enqueue(sqlite_tenants.queue, app, {"n": 1}, tenant=47)
    drain(worker_for(app, api_resolver(base), max_retry=1), sqlite_tenants.queue)
    row = tasks(sqlite_tenants.queue, app)[0]
    assert row.message.startswith(f"TenantError: password grant: {base}/token answered HTTP 401")
    assert auth.calls == []
    for record in caplog.records:
        assert_no_secret(record.getMessage(), auth)
    assert "Pa55" not in repr(api_resolver(base))


def test_the_command_refuses_a_bad_multi_database_environment(tmp_path: Path) -> None:
    """One line, no traceback, secrets kept out of it."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    cases = [
        (
            {"MULTI_DATABASE": "true", "SQLA_QUEUE_TENANT_URL_TEMPLATE": "sqlite:///{tenant}"},
            "Error: RecordingWorker.execute must take (self, payload, task, session, "
            "tenant_session) in multi-database mode",
        ),
        ({"MULTI_DATABASE": "maybe"}, "Error: MULTI_DATABASE must be true or false"),
    ]
    for env, message in cases:
        proc = run_cli(
            "worker",
            "tests.support.app:RecordingWorker",
            "--url",
            url,
            "--burst",
            env=env,
            check=False,
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert message in proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr


# ---------------------------------------------------------------- pub/sub
def test_pubsub_copies_write_to_their_tenants_database(pg_tenants: Tenants) -> None:
    """A pub/sub worker in multi-database mode: each copy's handler gets the
    tenant's session after the queue's; a failing one rolls its tenant writes
    back and reaches its dead handler alone."""
    papp = build_pubsub(f"fila_{uuid.uuid4().hex[:10]}")
    papp.Base.metadata.create_all(pg_tenants.queue)
    try:

        class Tenanted(WorkerPubSubBase):
            model = papp.Task
            subscriber_model = papp.Subscriber
            tenant_resolver = UrlTemplateResolver(pg_tenants.template)
            max_retry = 2
            retry_interval_minutes = 0

            @subscriber("book")
            def book(
                self,
                payload: Any,
                subscription: Any,
                task: Any,
                session: Session,
                tenant_session: Session,
            ) -> str:
                insert_once(
                    tenant_session,
                    chain_id=task.chain_id,
                    tenant=task.tenant,
                    note=f"{subscription.id}:{payload['n']}",
                )
                return "booked"

            @subscriber("broken")
            def broken(
                self,
                payload: Any,
                subscription: Any,
                task: Any,
                session: Session,
                tenant_session: Session,
            ) -> None:
                insert_once(
                    tenant_session, chain_id=task.chain_id, tenant=task.tenant, note="must vanish"
                )
                tenant_session.flush()
                raise RuntimeError("broken on purpose")

            @dead_subscriber("broken")
            def broken_dead(
                self,
                payload: Any,
                subscription: Any,
                task: Any,
                session: Session,
                tenant_session: Session,
            ) -> str:
                return f"dead in tenant {task.tenant}"

        with Session(pg_tenants.queue) as session, session.begin():
            session.add_all(papp.Subscriber(id=sid, process="pedido") for sid in ("book", "broken"))
        with pg_tenants.queue.begin() as conn:
            client = QueueClient(conn, papp.Task)
            for n, tenant in enumerate((47, 48)):
                client.insert_task_pub_sub(process="pedido", payload={"n": n}, tenant=tenant)
        drain(Tenanted, pg_tenants.queue)

        with Session(pg_tenants.queue) as session:
            found = list(session.scalars(select(papp.Task).order_by(papp.Task.id)))
        books = {t.tenant: t for t in found if t.subscriber_id == "book"}
        assert {t: (b.status, b.message) for t, b in books.items()} == {
            47: ("sucesso", "booked"),
            48: ("sucesso", "booked"),
        }
        dead = sorted(t.message for t in found if t.subscriber_id == "broken" and t.dead)
        assert dead == ["dead in tenant 47", "dead in tenant 48"]
        assert ledger(pg_tenants.urls[47]) == [(books[47].id, 47, "book:0")]
        assert ledger(pg_tenants.urls[48]) == [(books[48].id, 48, "book:1")]
    finally:
        papp.Base.metadata.drop_all(pg_tenants.queue)


# ------------------------------------------------------------ time limits
@pytest.fixture(params=["postgresql", "mysql"])
def server_tenants(request: pytest.FixtureRequest, tmp_path: Path, app: App) -> Iterator[Tenants]:
    yield from _make_tenants(request.param, tmp_path, app)


def _running_sleeps(url: str) -> int:
    """Statements of other sessions sleeping in the tenant's database."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = (
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'active' AND query LIKE 'SELECT pg_sleep%%' "
                    "AND pid <> pg_backend_pid()"
                )
            else:
                query = (
                    "SELECT count(*) FROM information_schema.PROCESSLIST "
                    "WHERE db = DATABASE() AND info LIKE 'SELECT SLEEP%%'"
                )
            return int(conn.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


def test_a_time_limit_cancels_the_tenant_databases_statement(
    server_tenants: Tenants, app: App
) -> None:
    tenants = server_tenants
    [task_id] = enqueue(tenants.queue, app, {"n": 1}, tenant=47)
    sleep = "SELECT pg_sleep(60)" if tenants.kind == "postgresql" else "SELECT SLEEP(60)"

    class Worker(worker_for(app, UrlTemplateResolver(tenants.template))):  # type: ignore[misc]
        time_limit_seconds = 1
        max_retry = 1

        def execute(  # type: ignore[override]
            self, payload: Any, task: Any, session: Session, tenant_session: Session
        ) -> str | None:
            tenant_session.execute(text(sleep))
            return None

    drain(Worker, tenants.queue)
    first = next(t for t in tasks(tenants.queue, app) if t.id == task_id)
    assert first.status == "falha" and "time limit" in first.message
    # the tenant's statement was cancelled with the attempt, not left to run
    # its 60 s after the failure was recorded
    wait_until(
        lambda: _running_sleeps(tenants.urls[47]) == 0,
        timeout=20,
        message="the tenant's sleeping statement to be cancelled",
    )


def test_an_abandoned_attempts_tenant_commit_never_lands_after_its_failure(
    pg_tenants: Tenants, app: App
) -> None:
    """Attempt 1's tenant COMMIT is slow (a deferred trigger) and runs past
    the time limit. Whatever the timing, each tenant write must belong to the
    attempt the queue records as done: never the write of an attempt the
    queue recorded as failed (its COMMIT landing after attempt 2 ran)."""
    tenants = pg_tenants
    tenant = create_engine(tenants.urls[47])
    with tenant.begin() as conn:
        conn.execute(text("CREATE TABLE attempt_log (chain_id bigint, attempt int)"))
        conn.execute(
            text(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF NEW.attempt = 1 THEN PERFORM pg_sleep(3); END IF; RETURN NULL; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON attempt_log "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
        )
    [task_id] = enqueue(tenants.queue, app, {"n": 1}, tenant=47)

    class Worker(worker_for(app, UrlTemplateResolver(tenants.template))):  # type: ignore[misc]
        time_limit_seconds = 1
        max_retry = 3

        def execute(  # type: ignore[override]
            self, payload: Any, task: Any, session: Session, tenant_session: Session
        ) -> str | None:
            tenant_session.execute(
                text("INSERT INTO attempt_log VALUES (:c, :a)"),
                {"c": task.chain_id, "a": task.attempt},
            )
            return None

    try:
        drain(Worker, tenants.queue)
        # an abandoned COMMIT lands when the server finishes it: wait for the
        # tenant database to have no statement of ours left
        wait_until(lambda: _running_commits(tenant) == 0, timeout=30, message="the tenant's COMMIT")
        with tenant.connect() as conn:
            logged = conn.execute(text("SELECT attempt FROM attempt_log ORDER BY 1")).scalars()
            logged = list(logged)
    finally:
        tenant.dispose()
    chain = [t for t in tasks(tenants.queue, app) if (t.initial_id or t.id) == task_id]
    succeeded = [t.attempt for t in chain if t.status == "sucesso" and not t.dead]
    assert len(succeeded) == 1, [(t.attempt, t.status, t.message) for t in chain]
    assert logged == succeeded, [(t.attempt, t.status, t.message) for t in chain]


def _running_commits(tenant: Engine) -> int:
    with tenant.connect() as conn:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'active' AND pid <> pg_backend_pid()"
        )
        return int(conn.execute(text(query)).scalar_one())


def test_a_password_in_the_token_url_is_never_logged(
    fake_auth: tuple[FakeAuth, str], caplog: pytest.LogCaptureFixture
) -> None:
    """OAUTH_TOKEN_URL may carry a password (https://user:pass@auth/...): a
    refresh that fails logs a WARNING that names the URL, masked."""
    auth, base = fake_auth
    auth.parts = {47: {"hostname": "db", "port": 5432, "db_name": "erp_47", "user": "app"}}
    auth.expires_in = 11  # the access token expires 1 s after the grant
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    host = base.removeprefix("http://")
    resolver = CredentialsApiResolver(
        user="robot@example.com",
        password=SECRETS["password"],
        client_id="erp-worker",
        token_url=f"http://proxy-user:Url-pa55-SECRET@{host}/token",
        credentials_url=f"http://api-user:Api-pa55-SECRET@{host}/credentials",
        clock=clock,
    )
    resolver.database_url(47)
    clock.now += 2  # the access token expired: a refresh, refused
    auth.token_status = 400
    with pytest.raises(TenantError) as info:
        resolver.access_token()
    assert [g["grant_type"] for g in auth.grants] == ["password", "refresh_token", "password"]
    assert any("trying a new password grant" in r.getMessage() for r in caplog.records)
    for shown in [str(info.value), caplog.text, *(r.getMessage() for r in caplog.records)]:
        assert "Url-pa55-SECRET" not in shown and "Api-pa55-SECRET" not in shown
        assert_no_secret(shown, auth)
    auth.token_status, auth.credentials_status = 200, 500
    resolver.forget_token()
    with pytest.raises(TenantError) as info:
        resolver.database_url(48)
    assert "Api-pa55-SECRET" not in str(info.value) and "/credentials answered" in str(info.value)
