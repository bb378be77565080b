"""Servers of the tests' own, for fault-injection tests: PgBouncer, PostgreSQL, MariaDB.

A pytest plugin (``pytest_plugins = ["tests.support.servers"]`` in ``tests/conftest.py``).
The fixtures below are function-scoped: each test gets fresh processes it may
stop, restart or kill, and nothing it leaves behind (a session advisory lock on
a pooled server connection, a stopped server) reaches the next test. Only the
data directories they copy are made once per session. The shared servers at
5432 / 3306 are never stopped or restarted: other suites use them. Server
directories go in /dev/shm when it is a roomy tmpfs (SQLA_QUEUE_TEST_SERVER_DIR
overrides). Start-up, measured on the CI machine: pgbouncer 0.04 s; a private
PostgreSQL 0.14 s (plus 0.8 s once for initdb); a private MariaDB 0.18 s (plus
0.4 s once for mariadb-install-db).

``pgbouncer_transaction`` / ``pgbouncer_session``
    a :class:`PgBouncer` (``pool_mode`` transaction / session, 4 server
    connections) in front of the shared PostgreSQL test database;
    ``pgbouncer_transaction_url`` / ``pgbouncer_session_url`` are their URLs.
``pgbouncer_factory``
    ``pgbouncer_factory(pool_mode="transaction", *, target=None, pool_size=4,
    **settings)``: more PgBouncers, e.g. ``pool_size=1``, or in front of a
    :class:`PrivatePostgres` (``target=private_postgres``); ``settings`` are
    extra ``[pgbouncer]`` lines.
``private_postgres``
    a :class:`PrivatePostgres`: a cluster of the test's own (copied from one
    ``initdb`` per session) with ``stop`` / ``start`` / ``restart`` /
    ``kill`` / ``terminate_backends``.
``private_pgbouncer``
    a transaction-pooling :class:`PgBouncer` in front of ``private_postgres``.
``private_mariadb``
    a :class:`PrivateMariaDB` with ``stop`` / ``start`` / ``restart`` /
    ``kill`` / ``kill_connections``.

Tests using any of them get the ``servers`` marker (``-m "not servers"`` leaves
them out). A missing binary (``pgbouncer``, ``initdb``, ``mariadbd``) skips
them with the reason, or fails them under ``SQLA_QUEUE_REQUIRE_DATABASES=1``
(``.ci/run``), like a missing database server. ``scripts/install-test-deps.sh``
(run by ``make test``) installs PgBouncer; SQLA_QUEUE_TEST_PGBOUNCER names
another ``pgbouncer`` binary (say, 1.21+ to try its prepared statements).

psycopg 3 behind PgBouncer's transaction pooling
------------------------------------------------
psycopg 3 turns a statement into a named server-side prepared statement
(``_pg3_0``, ``_pg3_1``, … numbered per client connection) once it has run
``prepare_threshold`` times (default 5) on a connection, and from then on
sends only Bind/Execute for that name. PgBouncer before 1.21 (Debian 12 ships
1.18) does not track prepared statements, and in transaction mode each
transaction may run on another server connection. So from the sixth execution
on, a statement fails with ``prepared statement "_pg3_0" already exists``
(another client prepared its own ``_pg3_0`` there) or ``does not exist``, or,
worse, silently runs *another client's* ``_pg3_0`` with these parameters
(``test_default_prepare_threshold_runs_another_clients_statement``). Turn
psycopg's preparing off for every engine behind transaction pooling::

    create_engine(url, connect_args={"prepare_threshold": None})

(:attr:`PgBouncer.connect_args`; :meth:`PgBouncer.engine` passes it). It
cannot go in the URL: SQLAlchemy hands URL query values to psycopg as strings,
and ``?prepare_threshold=None`` fails on the first statement with
``TypeError: '>=' not supported between instances of 'int' and 'str'``.
PgBouncer 1.21+ tracks protocol-level prepared statements when
``max_prepared_statements`` is set (not tested here). Session pooling needs
nothing: a client keeps its server connection, and ``DISCARD ALL`` drops the
statements when it leaves.

Whatever the driver, transaction pooling hands session state to other
clients: session advisory locks (they belong to the server connection, which
outlives the client: ``test_advisory_lock_is_shared_by_clients_behind_transaction_pooling``),
``LISTEN``, ``SET``, temporary tables. ``ignore_startup_parameters`` lists
``options`` so that libpq clients with ``PGOPTIONS`` can connect; PgBouncer
then drops those options silently.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from sqlalchemy import Connection, Engine, create_engine, make_url, text

START_TIMEOUT = 30.0
SERVER_FIXTURES = frozenset(
    {
        "pgbouncer_factory",
        "pgbouncer_transaction",
        "pgbouncer_session",
        "pgbouncer_transaction_url",
        "pgbouncer_session_url",
        "private_postgres",
        "private_pgbouncer",
        "private_mariadb",
    }
)
PG_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
PG_STOP_MODES = tuple(PG_STOP_SIGNALS)
# connect_args for psycopg 3 behind PgBouncer < 1.21 in transaction mode: see above
TRANSACTION_POOLING_CONNECT_ARGS: dict[str, Any] = {"prepare_threshold": None}


# --------------------------------------------------------------------- plugin hooks
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "servers: starts servers of its own (PgBouncer, a private PostgreSQL or MariaDB; "
        "see tests/support/servers.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


# --------------------------------------------------------------------- helpers
def unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail under SQLA_QUEUE_REQUIRE_DATABASES=1."""
    if os.environ.get("SQLA_QUEUE_REQUIRE_DATABASES"):
        pytest.fail(reason)
    pytest.skip(reason)


def require_binary(name: str, hint: str) -> str:
    """The path of the executable ``name``, or skip (fail in CI) saying how to get it."""
    path = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin")
    if path is None:
        unavailable(f"{name} is not installed ({hint})")
    assert path is not None
    return path


def free_port() -> int:
    """A TCP port nobody listens on now (another process may take it before
    the server binds it: the starts below retry on a new port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def poll(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = START_TIMEOUT,
    log: Path | None = None,
) -> Any:
    """``predicate()`` once it is truthy; AssertionError (with the log's tail)
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{_tail(log)}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _tail(log: Path | None, lines: int = 20) -> str:
    if log is None or not log.exists():
        return ""
    text_ = log.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- {log} ---\n" + "\n".join(text_)


def _service_user(name: str) -> str | None:
    """The account servers run as: ``name`` when we are root (PgBouncer and
    PostgreSQL refuse to run as root), else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(name)
    except KeyError:
        unavailable(f"running as root, and there is no {name!r} user to run the server as")
    return name


def _user_kwargs(user: str | None) -> dict[str, Any]:
    """Popen arguments that run the child as ``user`` (its own groups only)."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _scratch() -> str | None:
    """Where server directories go: SQLA_QUEUE_TEST_SERVER_DIR, else /dev/shm
    when it is a roomy tmpfs (copying a cluster there takes a tenth of the
    time it takes on disk; fsync is off anyway), else the system temp dir."""
    if os.environ.get("SQLA_QUEUE_TEST_SERVER_DIR"):
        return os.environ["SQLA_QUEUE_TEST_SERVER_DIR"]
    with contextlib.suppress(OSError):
        stats = os.statvfs("/dev/shm")
        if stats.f_bavail * stats.f_frsize > 2 * 2**30 and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    return None


def _private_dir(prefix: str, user: str | None) -> Path:
    """A new directory of ``user``'s (pytest's temp dirs are root-only)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=_scratch()))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


# every server still running when the interpreter exits (a crashed run) is killed
_running: set[Any] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.close()


# --------------------------------------------------------------------- PgBouncer
class _Daemon:
    """A server process of a test's own on a free port of 127.0.0.1:
    ``start()`` launches it and waits until it answers (another port if the
    one it got was taken meanwhile), ``stop()`` / ``kill()`` signal it and
    wait until it has exited. Subclasses say how to launch it and how to
    tell it is up."""

    name = "server"
    port: int
    proc: subprocess.Popen[bytes] | None
    log_path: Path
    workdir: Path
    startup_seconds: float

    def _launch(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _up(self) -> bool:
        """True once the process answers; RuntimeError if it exited."""
        raise NotImplementedError

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout: float = START_TIMEOUT) -> None:
        started = time.monotonic()
        for _attempt in range(5):
            if not self.port:
                self.port = free_port()
            self.proc = self._launch()
            _running.add(self)
            try:
                poll(self._up, f"{self.name} on port {self.port}", timeout, self.log_path)
            except RuntimeError:
                if "Address already in use" in self.log():
                    self.port = 0  # taken since free_port(): another one
                    continue
                raise AssertionError(f"{self.name} did not start{_tail(self.log_path)}") from None
            self.startup_seconds = _since(started)
            return
        raise AssertionError(f"{self.name} found no free port{_tail(self.log_path)}")

    def stop(self, timeout: float = START_TIMEOUT) -> None:
        """SIGTERM, and wait until the process has exited."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL (a crash), and wait until the process has exited."""
        self._signal(signal.SIGKILL, START_TIMEOUT)

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        self.stop(timeout)
        self.start(timeout)

    def _signal(self, signum: int, timeout: float) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _running.discard(self)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


class PgBouncer(_Daemon):
    """A ``pgbouncer`` process of the test's own, on a free port of 127.0.0.1.

    ``url`` is the SQLAlchemy URL (psycopg 3) of the pooled database;
    ``connect_args`` what ``create_engine`` needs for this pool mode (see the
    module docstring); ``engine()`` an engine with both. ``admin(command)``
    runs a PgBouncer console command (``SHOW SERVERS``, ``PAUSE``, ``KILL test``,
    ``RECONNECT``…). ``stop()`` / ``start()`` / ``restart()`` / ``kill()`` keep
    the port. ``startup_seconds`` is how long the last start took.
    """

    name = "pgbouncer"

    def __init__(
        self,
        *,
        pool_mode: str,
        upstream: dict[str, Any],
        pool_size: int = 4,
        settings: dict[str, Any] | None = None,
    ) -> None:
        if pool_mode not in ("session", "transaction", "statement"):
            raise ValueError(f"pool_mode {pool_mode!r}")
        self.binary = require_binary(
            os.environ.get("SQLA_QUEUE_TEST_PGBOUNCER") or "pgbouncer",
            "apt-get install pgbouncer, or set SQLA_QUEUE_TEST_PGBOUNCER",
        )
        self.os_user = _service_user("postgres")
        self.pool_mode = pool_mode
        self.upstream = upstream
        self.user = upstream["user"]
        self.dbname = upstream["dbname"]
        self.workdir = _private_dir(f"sqlaq-pgbouncer-{pool_mode}-", self.os_user)
        self.log_path = self.workdir / "pgbouncer.log"
        self.config_path = self.workdir / "pgbouncer.ini"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        entry = " ".join(
            f"{key}={value}"
            for key, value in (
                ("host", upstream["host"]),
                ("port", upstream["port"]),
                ("dbname", upstream["dbname"]),
            )
            if value not in (None, "")
        )
        # trust for clients; the password (if any) logs PgBouncer into the server
        password = (upstream.get("password") or "").replace('"', '""')
        (self.workdir / "userlist.txt").write_text(f'"{self.user}" "{password}"\n')
        self._databases = f"{self.dbname} = {entry}\n"
        self.settings: dict[str, Any] = {
            "listen_addr": "127.0.0.1",
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": self.workdir / "userlist.txt",
            "admin_users": self.user,
            "pool_mode": pool_mode,
            "default_pool_size": pool_size,
            "min_pool_size": 0,
            "reserve_pool_size": 0,
            "max_client_conn": 100,
            # libpq/psycopg send only user, database and what the URL names
            # (application_name, client_encoding: PgBouncer tracks both);
            # pgjdbc and some poolers add these two
            "ignore_startup_parameters": "extra_float_digits,options",
            # session mode: a client's leftovers (prepared statements, SET,
            # advisory locks) go when it disconnects. Transaction mode never
            # runs it (unless server_reset_query_always): say so
            "server_reset_query": "DISCARD ALL" if pool_mode == "session" else "",
            # retry a server that refused a login after 1 s, not 15 (restarts)
            "server_login_retry": 1,
            "server_connect_timeout": 5,
            "logfile": self.log_path,
            "verbose": 0,
        }
        self.settings.update(settings or {})
        _chown_tree(self.workdir, self.os_user)
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={self.dbname} user={self.user}"

    @property
    def connect_args(self) -> dict[str, Any]:
        """``create_engine(url, connect_args=...)`` for psycopg 3 behind this pool."""
        return dict(TRANSACTION_POOLING_CONNECT_ARGS) if self.pool_mode != "session" else {}

    def engine(self, **kwargs: Any) -> Engine:
        kwargs["connect_args"] = {**self.connect_args, **kwargs.get("connect_args", {})}
        return create_engine(self.url, **kwargs)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A raw psycopg connection through PgBouncer (autocommit unless told)."""
        kwargs.setdefault("autocommit", True)
        for key, value in self.connect_args.items():
            kwargs.setdefault(key, value)
        return psycopg.connect(self.conninfo, connect_timeout=5, **kwargs)

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """Run a PgBouncer admin console command; its rows (none for most commands)."""
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} dbname=pgbouncer user={self.user}",
            autocommit=True,
            connect_timeout=5,
        ) as conn:
            cur = conn.execute(command)
            return cur.fetchall() if cur.description else []

    def _write_config(self) -> None:
        lines = ["[databases]", self._databases, "[pgbouncer]"]
        lines += [
            f"{key} = {value}" for key, value in {**self.settings, "listen_port": self.port}.items()
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def _up(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {self.proc and self.proc.returncode}")
        try:
            self.admin("SHOW VERSION")
        except psycopg.Error:
            return False
        return True

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start pgbouncer and wait until its console answers (the upstream
        server is not contacted: a test may start it with the server down).
        SIGTERM in ``stop()`` is PgBouncer's immediate shutdown: clients are
        cut off."""
        super().start(timeout)

    def _launch(self) -> subprocess.Popen[bytes]:
        self._write_config()
        return subprocess.Popen(
            [self.binary, "-q", str(self.config_path)],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **_user_kwargs(self.os_user),
        )


def _shared_upstream() -> dict[str, Any]:
    from tests.conftest import server_url

    url = make_url(server_url("postgresql"))
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "dbname": url.database or "test",
        "user": url.username or "postgres",
        "password": url.password,
    }


@pytest.fixture
def pgbouncer_factory() -> Iterator[Callable[..., PgBouncer]]:
    """``make(pool_mode="transaction", *, target=None, pool_size=4, **settings)``:
    a started :class:`PgBouncer` in front of the shared PostgreSQL test
    database, or of ``target`` (a :class:`PrivatePostgres`). All stop after the test."""
    made: list[PgBouncer] = []

    def make(
        pool_mode: str = "transaction",
        *,
        target: PrivatePostgres | None = None,
        pool_size: int = 4,
        **settings: Any,
    ) -> PgBouncer:
        upstream = _shared_upstream() if target is None else target.upstream
        bouncer = PgBouncer(
            pool_mode=pool_mode, upstream=upstream, pool_size=pool_size, settings=settings
        )
        made.append(bouncer)
        return bouncer

    try:
        yield make
    finally:
        for bouncer in made:
            bouncer.close()


@pytest.fixture
def pgbouncer_transaction(pgbouncer_factory: Callable[..., PgBouncer]) -> PgBouncer:
    """PgBouncer, ``pool_mode=transaction``, 4 server connections, shared test db.
    Engines need ``connect_args=pgbouncer_transaction.connect_args``."""
    return pgbouncer_factory("transaction")


@pytest.fixture
def pgbouncer_session(pgbouncer_factory: Callable[..., PgBouncer]) -> PgBouncer:
    """PgBouncer, ``pool_mode=session``, 4 server connections, shared test db."""
    return pgbouncer_factory("session")


@pytest.fixture
def pgbouncer_transaction_url(pgbouncer_transaction: PgBouncer) -> str:
    """The URL of ``pgbouncer_transaction``. Pass
    ``connect_args={"prepare_threshold": None}`` to ``create_engine`` with it."""
    return pgbouncer_transaction.url


@pytest.fixture
def pgbouncer_session_url(pgbouncer_session: PgBouncer) -> str:
    return pgbouncer_session.url


# --------------------------------------------------------------------- PostgreSQL
def _pg_bindir() -> Path | None:
    """SQLA_QUEUE_TEST_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin,
    else where ``initdb`` / ``pg_config --bindir`` say."""
    if os.environ.get("SQLA_QUEUE_TEST_PG_BINDIR"):
        return Path(os.environ["SQLA_QUEUE_TEST_PG_BINDIR"])
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)],
    )
    if versions:
        return versions[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    return None


PG_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "autovacuum": "off",
    "max_connections": "100",
    "shared_buffers": "32MB",
}


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own on a free port of 127.0.0.1.

    ``url`` (SQLAlchemy, psycopg 3, database ``test``, user ``postgres``, no
    password), ``conninfo`` (libpq), ``port``, ``data_dir``, ``log_path``,
    ``pid`` (the postmaster's, None when down). Every method waits, with a
    deadline, until the server really is up (accepts a query) or down
    (refuses connections, no postmaster). ``startup_seconds``: the last start.
    """

    host = "127.0.0.1"
    user = "postgres"
    dbname = "test"

    def __init__(
        self, bindir: Path, template: Path | None, prefix: str = "sqlaq-postgres-"
    ) -> None:
        """Copy ``template`` (a stopped cluster's data dir); without it, the
        caller puts a cluster in ``data_dir`` (initdb) before ``start()``."""
        self.bindir = bindir
        self.os_user = _service_user("postgres")
        self.workdir = _private_dir(prefix, self.os_user)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "postgres.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        if template is not None:
            subprocess.run(["cp", "-a", str(template), str(self.data_dir)], check=True)
            _chown_tree(self.data_dir, self.os_user)

    # ---------------------------------------------------------------- addresses
    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{self.dbname}"

    @property
    def conninfo(self) -> str:
        return f"host={self.host} port={self.port} dbname={self.dbname} user={self.user}"

    @property
    def upstream(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "dbname": self.dbname, "user": self.user}

    def engine(self, **kwargs: Any) -> Engine:
        return create_engine(self.url, **kwargs)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A raw psycopg connection (autocommit unless told)."""
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.conninfo, connect_timeout=5, **kwargs)

    # ---------------------------------------------------------------- state
    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return None if self._exited() or self.proc is None else self.proc.pid

    def accepts(self) -> bool:
        """Whether a new connection runs a query now."""
        try:
            with psycopg.connect(self.conninfo, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _configure_port(self) -> None:
        lines = [
            f"port = {self.port}",
            f"unix_socket_directories = '{self.workdir}'",
        ]
        (self.data_dir / "instance.conf").write_text("\n".join(lines) + "\n")
        _chown_tree(self.data_dir / "instance.conf", self.os_user)

    def _exited(self) -> bool:
        """Whether the postmaster we started has exited (and is reaped: a
        zombie's pid in postmaster.pid would stop the next start)."""
        return self.proc is None or self.proc.poll() is not None

    def _up(self) -> bool:
        if self._exited():
            raise RuntimeError("postgres exited")
        return self.accepts()

    # ---------------------------------------------------------------- control
    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server (crash recovery included after ``kill``) and wait
        until it accepts a query. The postmaster is our child, not pg_ctl's:
        when it dies we reap it at once, so its pid cannot linger in the lock
        files as a zombie's."""
        if not self._exited():
            raise RuntimeError(f"postgres is already running (pid {self.pid})")
        started = time.monotonic()
        for _attempt in range(5):
            if not self.port:
                self.port = free_port()
                self._configure_port()
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [str(self.bindir / "postgres"), "-D", str(self.data_dir)],
                    cwd=self.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    **_user_kwargs(self.os_user),
                )
            _running.add(self)
            try:
                poll(self._up, f"postgres on port {self.port}", timeout, self.log_path)
            except RuntimeError:
                if "could not bind" in self.log_path.read_text(errors="replace"):
                    self.port = 0  # taken since free_port(): another one
                    continue
                raise AssertionError(f"postgres did not start{_tail(self.log_path)}") from None
            self.startup_seconds = _since(started)
            return
        raise AssertionError(f"postgres found no free port{_tail(self.log_path)}")

    def stop(self, mode: str = "fast", timeout: float = START_TIMEOUT) -> None:
        """Shut down like ``pg_ctl stop -m mode`` (smart: waits for clients;
        fast: disconnects them; immediate: no checkpoint, crash recovery at the
        next start), and wait until the postmaster has exited."""
        if mode not in PG_STOP_MODES:
            raise ValueError(f"mode must be one of {PG_STOP_MODES}, not {mode!r}")
        if not self._exited():
            assert self.proc is not None
            self.proc.send_signal(PG_STOP_SIGNALS[mode])
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"postgres did not stop in {timeout} s") from None
        _running.discard(self)

    def restart(self, mode: str = "fast", timeout: float = START_TIMEOUT) -> None:
        """``stop(mode)`` then ``start()``: every connection is dropped."""
        self.stop(mode, timeout)
        self.start(timeout)

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it forked (a crash), and
        wait until they are gone. ``start()`` then runs crash recovery."""
        if not self._exited():
            assert self.proc is not None
            pid = self.proc.pid
            os.kill(pid, signal.SIGSTOP)  # no more forks while we look
            victims = _children(pid)
            for victim in [pid, *victims]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            self.proc.wait(10)
            # orphaned backends are reaped by init; a zombie does no harm
            poll(lambda: not any(_alive(v) for v in victims), "postgres backends to die", 10)
        _running.discard(self)

    def terminate_backends(
        self,
        application_name_like: str | None = None,
        conn: Connection | None = None,
        timeout: float = 10.0,
    ) -> list[int]:
        """``pg_terminate_backend`` every client backend but the caller's (those
        whose application_name is LIKE ``application_name_like``, if given),
        and wait until they are gone. The caller is ``conn`` (a SQLAlchemy
        Connection, left in its transaction; no other connection is opened)
        or, without it, a connection of this method's own (whose backend may
        still be exiting on return). Returns the pids terminated, sorted."""
        # pg_terminate_backend in the select list, not in WHERE: the planner
        # may evaluate WHERE conditions in any order (and kill the caller)
        query = text(
            "SELECT pid, pg_terminate_backend(pid, :wait_ms) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
            "AND (CAST(:pattern AS text) IS NULL OR application_name LIKE :pattern)"
        )
        params = {"pattern": application_name_like, "wait_ms": int(timeout * 1000)}
        engine = None
        if conn is None:
            engine = self.engine(poolclass=_null_pool())
            conn = engine.connect()
        assert conn is not None
        caller = conn

        def left(pids: list[int]) -> int:
            # a transaction sees pg_stat_activity as of its first look at it
            caller.execute(text("SELECT pg_stat_clear_snapshot()"))
            return int(
                caller.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:pids)"),
                    {"pids": pids},
                ).scalar_one()
            )

        try:
            caller.execute(text("SELECT pg_stat_clear_snapshot()"))
            pids = sorted(pid for pid, _ in caller.execute(query, params))
            if pids:
                poll(lambda: left(pids) == 0, f"backends {pids} to go", timeout)
            return pids
        finally:
            if engine is not None:
                caller.close()
                engine.dispose()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _null_pool() -> Any:
    from sqlalchemy.pool import NullPool

    return NullPool


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[tuple[Path, Path]]:
    """(bindir, data dir): one ``initdb`` per session, with database ``test``;
    ``private_postgres`` copies it (``cp -a`` is several times faster than initdb)."""
    bindir = _pg_bindir()
    if bindir is None:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    assert bindir is not None
    template = PrivatePostgres(bindir, None, prefix="sqlaq-postgres-template-")
    template.dbname = "postgres"  # until test exists
    try:
        initdb = [str(bindir / "initdb"), "-D", str(template.data_dir), "-U", "postgres"]
        initdb += ["-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]
        initdb += ["--wal-segsize=1"]  # 1 MB WAL files: less to copy
        done = subprocess.run(
            initdb,
            cwd=template.workdir,
            **_user_kwargs(template.os_user),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise AssertionError(f"initdb failed: {done.stdout}{done.stderr}")
        with (template.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/support/servers.py\n")
            conf.writelines(f"{key} = {value}\n" for key, value in PG_SETTINGS.items())
            conf.write("include_if_exists = 'instance.conf'\n")
        template.start()
        with template.connect() as conn:
            conn.execute("CREATE DATABASE test")
        template.stop("fast")
        (template.data_dir / "instance.conf").unlink()  # each copy writes its own
        yield bindir, template.data_dir
    finally:
        template.close()


@pytest.fixture
def private_postgres(postgres_template: tuple[Path, Path]) -> Iterator[PrivatePostgres]:
    """A started :class:`PrivatePostgres`, removed after the test."""
    server = PrivatePostgres(*postgres_template)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def private_pgbouncer(
    private_postgres: PrivatePostgres, pgbouncer_factory: Callable[..., PgBouncer]
) -> PgBouncer:
    """A transaction-pooling :class:`PgBouncer` (4 server connections) in
    front of ``private_postgres``."""
    return pgbouncer_factory("transaction", target=private_postgres)


# --------------------------------------------------------------------- MariaDB
MARIADB_OPTIONS = [
    "--skip-name-resolve",
    "--innodb-log-file-size=4M",
    "--innodb-buffer-pool-size=32M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--skip-log-bin",
    "--max-connections=100",
]


class PrivateMariaDB(_Daemon):
    """A MariaDB server of the test's own: TCP on a free port of 127.0.0.1
    and a socket in its own directory.

    ``url`` (SQLAlchemy, PyMySQL, database ``test``, user ``root``, no
    password), ``port``, ``data_dir``, ``log_path``, ``pid``. ``stop()``
    (SIGTERM, a clean shutdown), ``kill()`` (SIGKILL: InnoDB recovers at the
    next start), ``start()``, ``restart()`` and ``kill_connections()`` wait
    until done. ``startup_seconds``: the last start.
    """

    name = "mariadbd"
    host = "127.0.0.1"
    user = "root"
    dbname = "test"

    def __init__(self, mariadbd: str, template: Path) -> None:
        self.mariadbd = mariadbd
        self.os_user = _service_user("mysql")
        self.workdir = _private_dir("sqlaq-mariadb-", self.os_user)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "error.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        subprocess.run(["cp", "-a", str(template), str(self.data_dir)], check=True)
        _chown_tree(self.data_dir, self.os_user)

    @property
    def url(self) -> str:
        return f"mysql+pymysql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def engine(self, **kwargs: Any) -> Engine:
        return create_engine(self.url, **kwargs)

    def connect(self, **kwargs: Any) -> Any:
        """A raw PyMySQL connection (autocommit unless told)."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 5)
        return pymysql.connect(
            host=self.host, port=self.port, user=self.user, database=self.dbname, **kwargs
        )

    def accepts(self) -> bool:
        try:
            conn = self.connect(connect_timeout=2)
        except pymysql.err.MySQLError:
            return False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True
        except pymysql.err.MySQLError:
            return False
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _up(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("mariadbd exited")
        return self.accepts()

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.pid is not None:
            raise RuntimeError(f"mariadbd is already running (pid {self.pid})")
        super().start(timeout)

    def _launch(self) -> subprocess.Popen[bytes]:
        argv = [
            self.mariadbd,
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.workdir / 'mysqld.sock'}",
            f"--pid-file={self.workdir / 'mysqld.pid'}",
            f"--log-error={self.log_path}",
            *MARIADB_OPTIONS,
        ]
        if self.os_user is not None:
            argv.append(f"--user={self.os_user}")
        return subprocess.Popen(
            argv,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill_connections(self, conn: Connection | None = None, timeout: float = 10.0) -> list[int]:
        """``KILL CONNECTION`` every client connection but the caller's
        (``conn``, a SQLAlchemy Connection, or one of this method's own), and
        wait until they are gone. Returns their ids."""
        own = None if conn is not None else self.connect()
        try:

            def run(sql: str) -> list[Any]:
                if conn is not None:
                    return list(conn.exec_driver_sql(sql).scalars())
                assert own is not None
                with own.cursor() as cur:
                    cur.execute(sql)
                    return [row[0] for row in cur.fetchall()]

            ids = run(
                "SELECT id FROM information_schema.PROCESSLIST "
                "WHERE id <> CONNECTION_ID() AND command NOT IN ('Daemon', 'Binlog Dump') "
                "AND user NOT IN ('system user', 'event_scheduler')"
            )
            for ident in ids:
                with contextlib.suppress(Exception):  # gone meanwhile: Unknown thread id
                    run(f"KILL CONNECTION {int(ident)}")

            def gone() -> bool:
                if not ids:
                    return True
                listed = ", ".join(str(int(i)) for i in ids)
                return not run(
                    f"SELECT id FROM information_schema.PROCESSLIST WHERE id IN ({listed})"
                )

            poll(gone, f"connections {ids} to go", timeout)
            return ids
        finally:
            if own is not None:
                own.close()


@pytest.fixture(scope="session")
def mariadb_template() -> Iterator[tuple[str, Path]]:
    """(mariadbd, data dir): one ``mariadb-install-db`` per session, with
    database ``test`` and root without a password; ``private_mariadb`` copies it."""
    mariadbd = require_binary("mariadbd", "apt-get install mariadb-server")
    install_db = require_binary("mariadb-install-db", "apt-get install mariadb-server")
    os_user = _service_user("mysql")
    workdir = _private_dir("sqlaq-mariadb-template-", os_user)
    data_dir = workdir / "data"
    try:
        argv = [
            install_db,
            "--no-defaults",
            f"--datadir={data_dir}",
            "--auth-root-authentication-method=normal",
            "--skip-name-resolve",
            "--innodb-log-file-size=4M",
            "--innodb-undo-tablespaces=0",
        ]
        if os_user is not None:
            argv.append(f"--user={os_user}")
        done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"mariadb-install-db failed: {done.stdout}{done.stderr}")
        yield mariadbd, data_dir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def private_mariadb(mariadb_template: tuple[str, Path]) -> Iterator[PrivateMariaDB]:
    """A started :class:`PrivateMariaDB`, removed after the test."""
    server = PrivateMariaDB(*mariadb_template)
    try:
        server.start()
        yield server
    finally:
        server.close()
