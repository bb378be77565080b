"""Database fixtures: real PostgreSQL, MariaDB/MySQL and SQLite.

A server URL comes from SQLA_QUEUE_TEST_POSTGRES_URL / SQLA_QUEUE_TEST_MYSQL_URL,
else the local server on its default port, else a testcontainers container
when a Docker engine answers, else the tests skip with the reason. With
SQLA_QUEUE_REQUIRE_DATABASES=1 (set by .ci/run) a missing server fails the
run instead of skipping it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.orm import Session

from sqla_queue import install, uninstall
from sqla_queue.config.settings import normalize_url
from tests.support.app import App, build

# PgBouncer and private PostgreSQL / MariaDB servers for fault-injection tests;
# the SparkSession the Spark tests share
pytest_plugins = ["tests.support.servers", "tests.support.spark_fixtures"]

ROOT = Path(__file__).resolve().parent.parent

# Fuzz tests (marked "fuzz"): a short, fixed-seed run in make test (the same
# examples every time, so it cannot flake), a long random one under make
# fuzz (SQLA_QUEUE_FUZZ_EXAMPLES set). Bounded generators that are not
# hypothesis strategies read fuzz_examples() too.
_FUZZ_EXAMPLES = os.environ.get("SQLA_QUEUE_FUZZ_EXAMPLES")


def fuzz_examples(short: int = 200) -> int:
    return int(_FUZZ_EXAMPLES) if _FUZZ_EXAMPLES else short


hypothesis_settings.register_profile(
    "sqla_queue",
    max_examples=fuzz_examples(),
    derandomize=_FUZZ_EXAMPLES is None,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
hypothesis_settings.load_profile("sqla_queue")
LOCAL_URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/test",
}
ENV_VARS = {"postgresql": "SQLA_QUEUE_TEST_POSTGRES_URL", "mysql": "SQLA_QUEUE_TEST_MYSQL_URL"}
_containers: list[Any] = []


def _reachable(url: str) -> str | None:
    try:
        engine = create_engine(normalize_url(url))
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:
        return str(exc).splitlines()[0]


def _container_url(kind: str) -> str | None:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return None
    if kind == "postgresql":
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:15", driver="psycopg")
    else:
        from testcontainers.mysql import MySqlContainer

        container = MySqlContainer("mariadb:10.11")
    container.start()
    _containers.append(container)
    return container.get_connection_url()


_resolved: dict[str, tuple[str | None, str]] = {}


def _worker_database(url: str) -> str:
    """Under pytest-xdist (``make test`` runs two workers), the database of
    this worker: ``<database>_gw0``, ``<database>_gw1``…, created on first use
    beside the configured one. Each worker's tests then see only their own
    sessions, locks and LISTEN channels: PostgreSQL's advisory locks, its
    vacuum horizon and MariaDB's GET_LOCK names are per database (or made so
    by the adapters), and the reference library's task locks are not."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return url
    base = normalize_url(url)
    name = f"{base.database}_{worker}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if base.get_backend_name() == "postgresql":
                exists = conn.execute(
                    text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
                ).first()
                if exists is None:
                    conn.execute(text(f'CREATE DATABASE "{name}"'))
            else:
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS `{name}`"))
    finally:
        admin.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


def server_url(kind: str) -> str:
    """The URL of a reachable server of ``kind``, or skip (fail in CI)."""
    if kind not in _resolved:
        url = os.environ.get(ENV_VARS[kind]) or LOCAL_URLS[kind]
        error = _reachable(url)
        if error is not None:
            container = _container_url(kind)
            if container is not None:
                url, error = container, None
        if error is None:
            url = _worker_database(url)
        _resolved[kind] = (None if error else url, error or "")
    url, error = _resolved[kind]
    if url is None:
        reason = f"no {kind} server: {error} (set {ENV_VARS[kind]})"
        if os.environ.get("SQLA_QUEUE_REQUIRE_DATABASES"):
            pytest.fail(reason)
        pytest.skip(reason)
    return url


#: seconds a Spark test may take (pytest-timeout), setup included
SPARK_TEST_TIMEOUT = 360
#: the Spark tests of this file are a group of their own (an xdist_group):
#: about half of the Spark tests' time (the 200,000 rows), the other files
#: together the other half (the archive, the commands, the report), so that
#: neither group's worker is the suite's critical path
SPARK_ENQUEUE_FILE, SPARK_ENQUEUE_GROUP = "test_spark_enqueue.py", "spark-enqueue"
#: the group of the other Spark tests; every test of SPARK_ARCHIVE_FILE is in it
SPARK_GROUP, SPARK_ARCHIVE_FILE = "spark", "test_spark_archive.py"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup``: the Spark tests in two groups,
    each on one worker that starts the SparkSession (a JVM) its group shares;
    test_spark_enqueue.py is one group. First of the hook's implementations:
    pytest-xdist's own reads the groups (on each worker, into the test ids),
    and until 2026-11-27 it ran before this one and saw none, so every
    worker started a SparkSession of its own."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            enqueue = item.path.name == SPARK_ENQUEUE_FILE
            item.add_marker(
                pytest.mark.xdist_group(SPARK_ENQUEUE_GROUP if enqueue else SPARK_GROUP)
            )
            if item.get_closest_marker("timeout") is None:
                # a JVM's jobs: 100 s quiet for the slowest (setup and call),
                # past the 120 s default under a busy loop, and a timeout in
                # the middle of a py4j call breaks the session its group shares
                item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """On pytest-xdist's controller, each worker's collected test ids: every
    test of test_spark_archive.py takes the ``spark`` fixture, so each id
    must end in its group. One without it has lost its group (as with
    pytest 9.2 and pytest-xdist 3.8: pytest-dev/pytest-xdist#1386), and
    every worker would start a JVM of its own, silently: stop instead."""
    archive = [i for i in ids if f"/{SPARK_ARCHIVE_FILE}::" in i]
    lost = [i for i in archive if not i.endswith(f"@{SPARK_GROUP}")]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup lost the group of {lost[0]}: this pytest and pytest-xdist "
            "do not group tests (pytest-dev/pytest-xdist#1386); pytest below 9.2 does"
        )


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    for container in _containers:
        container.stop()


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using it runs once per database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return str(normalize_url(server_url(request.param)).render_as_string(hide_password=False))


#: the worker classes of each kind, by role: the process and fault tests run
#: with the sync ones and with the async ones (tests/support/async_app.py)
WORKER_CLASSES = {
    "sync": {
        "recording": "tests.support.app:RecordingWorker",
        "blocking": "tests.support.app:BlockingWorker",
        "killer": "tests.support.app:KillerWorker",
    },
    "async": {
        "recording": "tests.support.async_app:Recording",
        "blocking": "tests.support.async_app:Blocking",
        "killer": "tests.support.async_app:Killer",
    },
}


@pytest.fixture(params=["sync", "async"])
def workers(request: pytest.FixtureRequest) -> dict[str, str]:
    """The worker classes (module:Class) of one kind, by role."""
    return WORKER_CLASSES[request.param]


@pytest.fixture
def table_name() -> str:
    return f"fila_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def app(table_name: str) -> App:
    return build(table_name)


@contextlib.contextmanager
def created_engine(db_url: str, metadata: MetaData, **options: Any) -> Iterator[Engine]:
    """An engine on ``db_url`` (``create_engine``'s ``options``) with
    ``metadata``'s tables created, dropped (and the engine disposed) on the
    way out."""
    engine = create_engine(db_url, **options)
    metadata.create_all(engine)
    try:
        yield engine
    finally:
        metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture
def engine(db_url: str, app: App) -> Iterator[Engine]:
    """An engine with the app's tables created (and dropped afterwards)."""
    with created_engine(db_url, app.Base.metadata) as engine:
        yield engine


@pytest.fixture
def observer(engine: Engine) -> Iterator[Engine]:
    """A second engine on the same database: sees only what is committed."""
    other = create_engine(engine.url.render_as_string(hide_password=False))
    try:
        yield other
    finally:
        other.dispose()


@pytest.fixture
def papp(table_name: str) -> Any:
    """A pub/sub application (tests/support/pubsub_app.py) on a fresh table name."""
    from tests.support.pubsub_app import build as build_pubsub

    return build_pubsub(table_name)


@pytest.fixture
def pengine(db_url: str, papp: Any) -> Iterator[Engine]:
    """An engine with the pub/sub app's tables created (and dropped afterwards)."""
    with created_engine(db_url, papp.Base.metadata) as engine:
        yield engine


@pytest.fixture
def server() -> Iterator[Any]:
    """A real HTTP server on 127.0.0.1 (tests/integration/test_webhooks.py says what it answers)."""
    from tests.integration.test_webhooks import _start

    yield from _start()


@pytest.fixture
def other_server() -> Iterator[Any]:
    """A second one: another origin."""
    from tests.integration.test_webhooks import _start

    yield from _start()


@pytest.fixture
def installed() -> Iterator[None]:
    install(Session)
    try:
        yield
    finally:
        uninstall(Session)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.02,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the real ``sqla-queue`` CLI in a subprocess from the repo root."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "sqla_queue.cli", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"sqla-queue {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def spawn_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "sqla_queue.cli", *args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# The seed's columns in the reference DDL's order (nsj-reference.md §1): written
# out here, not taken from the library, so the tests check the library against it.
SEED_COLUMNS = [
    "id",
    "id_inicial",
    "data_hora_inicial",
    "data_hora",
    "origem",
    "destino",
    "processo",
    "chave_externa",
    "proxima_tentativa",
    "tentativa",
    "status",
    "reenfileirado",
    "estouro_tentativas",
    "mensagem",
    "id_anterior",
    "data_hora_anterior",
    "status_anterior",
    "mensagem_anterior",
    "payload",
    "tenant",
    "grupo_empresarial",
    "payload_hash",
    "pub_sub",
    "publication_id",
    "subscriber_id",
    "dead",
    "live_id",
    "prioridade",
]


# sqla-queue's own columns, after the seed's: the claim's owner and lease
LEASE_COLUMNS = ["worker_id", "lease_expires_at"]
# and when each attempt was claimed and ended
TIMING_COLUMNS = ["started_at", "finished_at"]
ERROR_COLUMNS = ["error_traceback"]
# the trace that enqueued the task (sqla_queue.ops.tracing)
TRACE_COLUMNS = ["trace_context"]
TABLE_COLUMNS = SEED_COLUMNS + LEASE_COLUMNS + TIMING_COLUMNS + ERROR_COLUMNS + TRACE_COLUMNS


def lock_waits(engine: Engine, table_name: str) -> int:
    """Statements on ``table_name`` waiting for an InnoDB row lock. InnoDB
    refreshes this view only after 0.1 s without reads: poll it slower."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM information_schema.INNODB_TRX "
                "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE :pattern"
            ),
            {"pattern": f"%{table_name}%"},
        ).scalar_one()


# ---------------------------------------------- databases the run did not test
EXAMPLE_URLS = {
    "postgresql": "postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE",
    "mysql": "mysql+pymysql://USER:PASSWORD@HOST:3306/DATABASE",
}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any) -> Iterator[None]:
    """Say which databases were skipped, and how to point the suite at them.

    A wrapper, and the outermost one (tryfirst), so that this comes after
    pytest's own short summary: the last thing before the final counts, where
    a "passed" run that never touched PostgreSQL or MariaDB cannot be missed."""
    try:
        return (yield)
    finally:
        _report_untested_databases(terminalreporter)


def _report_untested_databases(terminalreporter: Any) -> None:
    skipped: dict[str, list[str]] = {kind: [] for kind in ENV_VARS}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        for kind in skipped:
            # server_url's reason: "no KIND server: ERROR (set VARIABLE)"
            prefix, suffix = f"no {kind} server: ", f" (set {ENV_VARS[kind]})"
            if prefix in reason:
                skipped[kind].append(reason.partition(prefix)[2].removesuffix(suffix))
    missing = {kind: errors for kind, errors in skipped.items() if errors}
    if not missing:
        return
    terminalreporter.write_sep("=", "DATABASES NOT TESTED", red=True, bold=True)
    for kind, errors in missing.items():
        tried = os.environ.get(ENV_VARS[kind]) or LOCAL_URLS[kind]
        shown = normalize_url(tried).render_as_string(hide_password=True)
        terminalreporter.write_line(
            f"{kind}: {len(errors)} test(s) skipped, no server at {shown}: {errors[0]}",
            red=True,
            bold=True,
        )
        terminalreporter.write_line(
            f"    to test it, point the suite at a server: {ENV_VARS[kind]}={EXAMPLE_URLS[kind]}"
        )
    terminalreporter.write_line(
        "    (or start the local server, or a Docker engine for testcontainers; "
        "SQLA_QUEUE_REQUIRE_DATABASES=1 makes a missing server fail the run)"
    )
