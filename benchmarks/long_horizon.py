"""Long-horizon PostgreSQL job-queue benchmark: does claim latency stay flat
over time when nothing vacuums or analyses the queue table?

For each system in ``--systems`` (one after the other, so that they never
compete for the machine's cores) the harness, on a PostgreSQL cluster of its
own (initdb into a temporary directory, run as the ``postgres`` OS user when
started as root, every server setting at its default except ``autovacuum``,
which ``--autovacuum`` sets, ``off`` by default):

1. creates a database and the system's schema: sqla_queue through
   ``Base.metadata.create_all()`` of ``class Task(QueueMixin, Base)`` on table
   ``lh_fila``; procrastinate through ``app.schema_manager.apply_schema()``;
   pgqueuer through ``Queries.install()`` (what ``pgq install`` runs). Nothing
   here runs ANALYZE or VACUUM.
2. starts workers with 8 lanes in all: sqla_queue's own CLI (``python -m
   sqla_queue.cli worker benchmarks.long_horizon:LhWorker --concurrency 8``,
   its default batch size; ``sqla_queue_batch1`` adds ``--batch-size 1``;
   ``sqla_queue_novacuum`` and ``sqla_queue_batch1_novacuum`` turn sqla-queue's
   own vacuum routine off too, SQLA_QUEUE_VACUUM_DEAD_TUPLES=0, so that no
   VACUUM runs at all);
   procrastinate: one ``run_worker(concurrency=8)`` with a sync task (run in
   a thread by procrastinate); pgqueuer: one ``QueueManager.run(batch_size=4,
   max_concurrent_tasks=8)`` whose async entrypoint runs the work in
   ``asyncio.to_thread`` (pgqueuer's documented way for blocking code; 4 is
   the largest batch size it allows under a cap of 8 in flight).
3. enqueues at a steady offered rate (``--rate`` tasks/s, open loop: each
   send is due at start + i/rate, whatever the previous commit took) for
   ``--minutes``, one task per transaction through the library's normal API
   (sqla_queue: ``QueueClient(s, "lh_fila").insert_task(...)`` inside ``with
   Session(engine) as s, s.begin()`` after ``install(Session)``;
   procrastinate: ``task.defer(k=key)`` (one autocommit statement on the
   app's pool); pgqueuer: ``Queries(AsyncpgDriver(conn)).enqueue(...)``).
   The enqueuer writes ``key commit-return-time`` per task.
4. each task's handler writes ``key wall-clock-start`` and sleeps 1 ms
   (``time.sleep(0.001)``, the "work").

Both records are appended to per-process files (one ``os.write`` of an
``O_APPEND`` descriptor per task: one small syscall, atomic for such short
lines, no lock, no extra database connection or WAL, so the database under
test sees only the queue's own traffic). The handler records and then works:
"claim latency" = handler start - enqueue commit returned.

Once a minute (of each system's run) the harness samples, on its own
autocommit connection: ``n_dead_tup``/``n_live_tup`` (pg_stat_user_tables) of
the queue table, ``pg_table_size``/``pg_indexes_size``/
``pg_total_relation_size`` of the system's job tables (sqla_queue:
``lh_fila``; procrastinate: ``procrastinate_jobs`` + ``procrastinate_events``;
pgqueuer: ``pgqueuer`` + ``pgqueuer_log`` + ``pgqueuer_statistics``; the
queue table named first), and the oldest backend xmin's age. Per minute of
enqueue it reports claim latency p50/p99 of the tasks enqueued in that
minute (computed at the end, once every task has started), and ``done/s``:
handler starts in that minute / 60 (each handler is 1 ms, so a started task
is a finished one within its batch's commit).

``--pin-horizon-minutes A:B`` opens a REPEATABLE READ transaction on a
separate connection at minute A (one ``SELECT now()``, which takes its
snapshot) and keeps it open until minute B: a pinned vacuum horizon, as an
idle-in-transaction client or a long report would hold.

At the end the enqueuer stops, the harness polls (deadline ``--drain-timeout``)
until every task has started and the system shows none pending or running,
records bytes per finished task (total relation size of the job tables /
tasks enqueued), and stops the workers and, at the very end (also on Ctrl-C
or an error), the cluster.

Peers run from their own venvs (never the project's):

    for p in procrastinate pgqueuer; do
      python3 -m venv /tmp/bench-venvs/$p &&
      /tmp/bench-venvs/$p/bin/pip install -r ../shared/bench/requirements/$p.txt
    done

Run from the repository root with the project's venv:

    .venv/bin/python benchmarks/long_horizon.py [--minutes 30] [--rate 200] \\
        [--systems sqla_queue,sqla_queue_batch1,procrastinate,pgqueuer] \\
        [--autovacuum off|on] [--pin-horizon-minutes 10:20] [--output FILE]

Writes ``benchmarks/results/long_horizon/<UTC timestamp>.json`` (the rows per
system and the settings, with the git commit of the checkout and whether it
was dirty) and prints a markdown table per system. Each system takes its
``--minutes`` plus ~5 s of setup and drain (a 2-minute smoke run: 124 s per
system), so a full default run of the four systems takes about 2 h 1 min.
``benchmarks/long_horizon_plot.py`` draws one or more result files.

The hidden sub-commands ``_setup``, ``_enqueue`` and ``_worker`` are what the
harness runs, with the right venv's interpreter, in its subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import json
import math
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results" / "long_horizon"
PG_BIN = pathlib.Path(os.environ.get("LH_PG_BIN", "/usr/lib/postgresql/15/bin"))
VENVS = pathlib.Path(os.environ.get("LH_VENVS", "/tmp/bench-venvs"))
TABLE = "lh_fila"
LANES = 8
WORK_SECONDS = 0.001
RECORD_DIR_ENV = "LH_RECORD_DIR"
SETUP_SQL_ENV = "LH_SQLA_SETUP_SQL"
DEFAULT_SYSTEMS = "sqla_queue,sqla_queue_batch1,procrastinate,pgqueuer"
MINUTE = 60.0

# --------------------------------------------------------------- recording


_record_fd: int | None = None
_record_lock = threading.Lock()


def _record_start(key: int) -> None:
    """Append ``key start-time`` to this process's starts file (handlers)."""
    global _record_fd
    now = time.time()
    if _record_fd is None:
        with _record_lock:
            if _record_fd is None:
                path = os.path.join(os.environ[RECORD_DIR_ENV], f"starts-{os.getpid()}.txt")
                _record_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_record_fd, f"{key} {now:.6f}\n".encode())


# ------------------------------------------- sqla_queue model and worker
# Defined only where sqla_queue imports: the peers' venvs run this module
# for their own drivers and have neither SQLAlchemy nor sqla_queue.

try:
    from sqlalchemy.orm import DeclarativeBase
    from sqlalchemy.orm import Session as _Session

    from sqla_queue import QueueMixin, TaskRecord, WorkerBase
except ImportError:  # a peer's venv
    pass
else:

    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = TABLE

    class LhWorker(WorkerBase):
        """Records the start, then 1 ms of work."""

        model = Task

        def execute(self, payload: Any, task: TaskRecord, session: _Session) -> str | None:
            _record_start(int(payload["k"]))
            time.sleep(WORK_SECONDS)
            return None


# --------------------------------------------------- subprocess drivers


def _due(rate: float, seconds: float, start_at: float) -> Iterator[tuple[int, float]]:
    """Open-loop sends: (task i, seconds until it is due at start_at + i/rate)."""
    key = 0
    while (due := start_at + key / rate) < start_at + seconds:
        yield key, due - time.time()
        key += 1


class _EnqueueLog:
    """``key commit-return-time`` lines, appended to the enqueues file."""

    def __init__(self) -> None:
        path = os.path.join(os.environ[RECORD_DIR_ENV], f"enqueues-{os.getpid()}.txt")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def sent(self, key: int) -> None:
        os.write(self.fd, f"{key} {time.time():.6f}\n".encode())

    def close(self) -> None:
        os.close(self.fd)


def _pace(rate: float, seconds: float, start_at: float, send: Callable[[int], None]) -> None:
    log = _EnqueueLog()
    for key, delay in _due(rate, seconds, start_at):
        if delay > 0:
            time.sleep(delay)  # pacing to the next send time
        send(key)
        log.sent(key)
    log.close()


async def _pace_async(
    rate: float, seconds: float, start_at: float, send: Callable[[int], Any]
) -> None:
    """:func:`_pace` for an async ``send``."""
    log = _EnqueueLog()
    for key, delay in _due(rate, seconds, start_at):
        if delay > 0:
            await asyncio.sleep(delay)  # pacing to the next send time
        await send(key)
        log.sent(key)
    log.close()


def _sqla_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def _procrastinate_app(url: str) -> Any:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="lh")
    def lh(k: int) -> None:  # sync: procrastinate runs it in a thread
        _record_start(k)
        time.sleep(WORK_SECONDS)

    return app


def _driver_setup(system: str, url: str) -> None:
    if system.startswith("sqla_queue"):
        from sqlalchemy import create_engine, text

        engine = create_engine(_sqla_url(url))
        Base.metadata.create_all(engine)
        # experiments with the schema: statements run after create_all
        # (LH_SQLA_SETUP_SQL, separated by ';'), recorded in the report
        with engine.begin() as conn:
            for statement in filter(None, os.environ.get(SETUP_SQL_ENV, "").split(";")):
                conn.execute(text(statement))
        engine.dispose()
    elif system == "procrastinate":
        app = _procrastinate_app(url)
        with app.open():
            app.schema_manager.apply_schema()
    elif system == "pgqueuer":

        async def install() -> None:
            import asyncpg
            from pgqueuer.db import AsyncpgDriver
            from pgqueuer.queries import Queries

            conn = await asyncpg.connect(url)
            try:
                await Queries(AsyncpgDriver(conn)).install()
            finally:
                await conn.close()

        asyncio.run(install())
    else:
        raise SystemExit(f"unknown system {system!r}")


def _driver_enqueue(system: str, url: str, rate: float, seconds: float, start_at: float) -> None:
    if system.startswith("sqla_queue"):
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        from sqla_queue import QueueClient, install

        install(Session)
        engine = create_engine(_sqla_url(url))

        def send(key: int) -> None:
            with Session(engine) as s, s.begin():
                QueueClient(s, TABLE).insert_task(processo="lh", payload={"k": key})

        _pace(rate, seconds, start_at, send)
        engine.dispose()
    elif system == "procrastinate":
        app = _procrastinate_app(url)
        with app.open():
            task = app.tasks["lh"]
            _pace(rate, seconds, start_at, lambda key: task.defer(k=key))
    elif system == "pgqueuer":

        async def run() -> None:
            import asyncpg
            from pgqueuer.db import AsyncpgDriver
            from pgqueuer.queries import Queries

            conn = await asyncpg.connect(url)
            queries = Queries(AsyncpgDriver(conn))
            try:
                await _pace_async(
                    rate,
                    seconds,
                    start_at,
                    lambda key: queries.enqueue("lh", str(key).encode()),
                )
            finally:
                await conn.close()

        asyncio.run(run())
    else:
        raise SystemExit(f"unknown system {system!r}")


def _driver_worker(system: str, url: str) -> None:
    """The peers' workers (sqla_queue's run through its own CLI)."""
    if system == "procrastinate":
        _procrastinate_app(url).run_worker(concurrency=LANES, wait=True)
    elif system == "pgqueuer":

        async def run() -> None:
            import asyncpg
            from pgqueuer import QueueManager
            from pgqueuer.db import AsyncpgDriver
            from pgqueuer.queries import Queries

            conn = await asyncpg.connect(url)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("lh")
            async def lh(job: Any) -> None:
                _record_start(int(job.payload))
                await asyncio.to_thread(time.sleep, WORK_SECONDS)

            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, qm.shutdown.set)
            await qm.run(batch_size=LANES // 2, max_concurrent_tasks=LANES)

        asyncio.run(run())
    else:
        raise SystemExit(f"no _worker driver for {system!r}")


def _driver_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="long_horizon.py (internal)")
    parser.add_argument("command", choices=["_setup", "_enqueue", "_worker"])
    parser.add_argument("system")
    parser.add_argument("url")
    parser.add_argument("--rate", type=float)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--start-at", type=float)
    args = parser.parse_args(argv)
    if args.command == "_setup":
        _driver_setup(args.system, args.url)
    elif args.command == "_enqueue":
        _driver_enqueue(args.system, args.url, args.rate, args.seconds, args.start_at)
    else:
        _driver_worker(args.system, args.url)


# ------------------------------------------------------------- systems


@dataclass(frozen=True)
class System:
    name: str
    tables: tuple[str, ...]  # the job tables; the first is the queue table
    unfinished_sql: str  # tasks still pending or running
    peer_venv: str | None = None  # None: the project's own interpreter
    batch_size: int | None = None
    #: environment variables for the worker (sqla-queue settings)
    worker_env: tuple[tuple[str, str], ...] = ()

    @property
    def python(self) -> str:
        if self.peer_venv is None:
            return sys.executable
        return str(VENVS / self.peer_venv / "bin" / "python")

    @property
    def queue_table(self) -> str:
        return self.tables[0]


_SQLA_UNFINISHED = (
    f"SELECT count(*) FROM {TABLE} WHERE status IN ('pendente', 'processando', 'agendada')"
)
SYSTEMS = {
    "sqla_queue": System("sqla_queue", (TABLE,), _SQLA_UNFINISHED),
    "sqla_queue_batch1": System("sqla_queue_batch1", (TABLE,), _SQLA_UNFINISHED, batch_size=1),
    # the queue's speed must not depend on vacuum: sqla-queue's own vacuum
    # routine off too (autovacuum is off on the benchmark's cluster)
    "sqla_queue_novacuum": System(
        "sqla_queue_novacuum",
        (TABLE,),
        _SQLA_UNFINISHED,
        worker_env=(("SQLA_QUEUE_VACUUM_DEAD_TUPLES", "0"),),
    ),
    "sqla_queue_batch1_novacuum": System(
        "sqla_queue_batch1_novacuum",
        (TABLE,),
        _SQLA_UNFINISHED,
        batch_size=1,
        worker_env=(("SQLA_QUEUE_VACUUM_DEAD_TUPLES", "0"),),
    ),
    "procrastinate": System(
        "procrastinate",
        ("procrastinate_jobs", "procrastinate_events"),
        "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        peer_venv="procrastinate",
    ),
    "pgqueuer": System(
        "pgqueuer",
        ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics"),
        "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')",
        peer_venv="pgqueuer",
    ),
}


# ------------------------------------------------------------- cluster


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as postgres binds
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError("no free port")


class Cluster:
    """A throwaway PostgreSQL cluster: initdb, pg_ctl start, stop and remove."""

    def __init__(self, port: int, autovacuum: bool) -> None:
        self.port = _free_port(port)
        self.autovacuum = autovacuum
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="lh-pg-"))
        self.data = self.root / "data"
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *command: str) -> None:
        subprocess.run(
            [*self.prefix, *command], check=True, cwd=self.root, stdout=subprocess.DEVNULL
        )

    def start(self) -> None:
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8",
        )  # fmt: skip
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            f"-c autovacuum={'on' if self.autovacuum else 'off'}"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", options, "-w", "start",
        )  # fmt: skip
        self.started = True

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.started:
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)


# ------------------------------------------------------------ processes


class Proc:
    """A subprocess in a session of its own, its output in a log file."""

    def __init__(self, name: str, command: list[str], log: pathlib.Path, env: dict[str, str]):
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with {code}:\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 15.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            if self.wait(grace) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


class Records:
    """``key time`` lines appended by subprocesses to ``PREFIX-<pid>.txt``
    files, read on from where the last read stopped (first time per key)."""

    def __init__(self, directory: pathlib.Path, prefix: str) -> None:
        self.directory = directory
        self.prefix = prefix
        self.offsets: dict[str, int] = {}
        self.times: dict[int, float] = {}
        self.lines = 0

    def read(self) -> None:
        for path in sorted(self.directory.glob(f"{self.prefix}-*.txt")):
            offset = self.offsets.get(path.name, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # complete lines only
            self.offsets[path.name] = offset + end
            for line in chunk[:end].splitlines():
                key_text, time_text = line.split()
                self.lines += 1
                key = int(key_text)
                if key not in self.times:
                    self.times[key] = float(time_text)


# ------------------------------------------------------------- sampling


_STATS_SQL = """
SELECT c.relname, coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
       pg_table_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid)
"""
_XMIN_SQL = (
    "SELECT coalesce(max(age(backend_xmin)), 0) FROM pg_stat_activity "
    "WHERE datname = current_database()"
)


def _sample_tables(conn: Any, system: System) -> dict[str, Any]:
    rows = conn.execute(_STATS_SQL, (list(system.tables),)).fetchall()
    tables = {
        r[0]: {
            "n_dead_tup": r[1],
            "n_live_tup": r[2],
            "table_bytes": r[3],
            "index_bytes": r[4],
            "total_bytes": r[5],
        }
        for r in rows
    }
    queue = tables.get(system.queue_table, {})
    return {
        "n_dead_tup": queue.get("n_dead_tup"),
        "n_live_tup": queue.get("n_live_tup"),
        "table_bytes": sum(t["table_bytes"] for t in tables.values()),
        "index_bytes": sum(t["index_bytes"] for t in tables.values()),
        "total_bytes": sum(t["total_bytes"] for t in tables.values()),
        "oldest_xmin_age": conn.execute(_XMIN_SQL).fetchone()[0],
        "tables": tables,
    }


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted ``values``."""
    if not values:
        return None
    return values[max(0, math.ceil(q / 100 * len(values)) - 1)]


def _latency_rows(
    t0: float, minutes: int, enqueues: dict[int, float], starts: dict[int, float]
) -> list[dict[str, Any]]:
    """Per minute of enqueue: claim latency of the tasks enqueued in it,
    handler starts in it."""
    latencies: list[list[float]] = [[] for _ in range(minutes)]
    enqueued = [0] * minutes
    missing = [0] * minutes
    started = [0] * minutes
    for key, committed in enqueues.items():
        m = min(max(int((committed - t0) // MINUTE), 0), minutes - 1)
        enqueued[m] += 1
        start = starts.get(key)
        if start is None:
            missing[m] += 1
        else:
            latencies[m].append((start - committed) * 1000.0)
    for start in starts.values():
        m = int((start - t0) // MINUTE)
        if 0 <= m < minutes:
            started[m] += 1
    rows = []
    for m in range(minutes):
        values = sorted(latencies[m])
        rows.append(
            {
                "minute": m + 1,
                "enqueued": enqueued[m],
                "not_started": missing[m],
                "p50_ms": _percentile(values, 50),
                "p99_ms": _percentile(values, 99),
                "max_ms": values[-1] if values else None,
                "done_per_s": started[m] / MINUTE,
            }
        )
    return rows


# ---------------------------------------------------------------- a run


@dataclass
class Settings:
    rate: float
    minutes: int
    pin: tuple[float, float] | None
    drain_timeout: float
    work_dir: pathlib.Path


@dataclass
class RunState:
    procs: list[Proc] = field(default_factory=list)
    pin_conn: Any = None

    def stop(self) -> None:
        if self.pin_conn is not None:
            with contextlib.suppress(Exception):
                self.pin_conn.close()
            self.pin_conn = None
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()


def _wait_until(deadline: float, procs: list[Proc]) -> None:
    """Sleep until ``deadline`` (a schedule), checking the processes each second."""
    while True:
        for proc in procs:
            proc.check_alive()
        left = deadline - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 1.0))


def _version(system: System) -> str:
    package = "sqla-queue" if system.peer_venv is None else system.peer_venv
    out = subprocess.run(
        [
            system.python,
            "-c",
            f"import importlib.metadata as m; print(m.version({package!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def run_system(cluster: Cluster, system: System, settings: Settings) -> dict[str, Any]:
    import psycopg

    database = f"lh_{system.name}"
    with psycopg.connect(cluster.url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    url = cluster.url(database)
    records_dir = settings.work_dir / system.name
    records_dir.mkdir()
    env = {**os.environ, RECORD_DIR_ENV: str(records_dir), "PYTHONUNBUFFERED": "1"}
    me = str(pathlib.Path(__file__).resolve())
    subprocess.run([system.python, me, "_setup", system.name, url], check=True, cwd=ROOT, env=env)
    state = RunState()
    result: dict[str, Any] = {"version": _version(system), "database": database}
    try:
        if system.peer_venv is None:
            worker = [
                system.python, "-m", "sqla_queue.cli", "worker",
                "benchmarks.long_horizon:LhWorker", "--url", _sqla_url(url),
                "--concurrency", str(LANES), "--log-level", "WARNING",
            ]  # fmt: skip
            if system.batch_size is not None:
                worker += ["--batch-size", str(system.batch_size)]
        else:
            worker = [system.python, me, "_worker", system.name, url]
        result["worker_command"] = " ".join(worker)
        worker_env = {**env, **dict(system.worker_env)}
        state.procs.append(Proc("worker", worker, records_dir / "worker.log", worker_env))
        seconds = settings.minutes * MINUTE
        t0 = time.time() + 3.0  # the enqueuer connects, then waits for t0
        enqueuer = Proc(
            "enqueuer",
            [
                system.python, me, "_enqueue", system.name, url,
                "--rate", str(settings.rate), "--seconds", str(seconds), "--start-at", str(t0),
            ],
            records_dir / "enqueuer.log",
            env,
        )  # fmt: skip
        state.procs.append(enqueuer)
        enqueues = Records(records_dir, "enqueues")
        starts = Records(records_dir, "starts")
        samples: list[dict[str, Any]] = []
        pin_info: dict[str, Any] = {}
        events: list[tuple[float, str]] = [
            (t0 + m * MINUTE, f"sample {m}") for m in range(1, settings.minutes + 1)
        ]
        if settings.pin is not None:
            events += [
                (t0 + settings.pin[0] * MINUTE, "pin"),
                (t0 + settings.pin[1] * MINUTE, "unpin"),
            ]
        events.sort(key=lambda e: (e[0], e[1] != "unpin"))
        with psycopg.connect(url, autocommit=True) as conn:
            for at, event in events:
                _wait_until(at, [p for p in state.procs if p is not enqueuer or at < t0 + seconds])
                if event == "pin":
                    state.pin_conn = psycopg.connect(url)
                    state.pin_conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    state.pin_conn.execute("SELECT now()").fetchone()
                    pin_info["opened_at_s"] = round(time.time() - t0, 1)
                    pin_info["backend_xmin"] = str(
                        conn.execute(
                            "SELECT backend_xmin FROM pg_stat_activity WHERE pid = %s",
                            (state.pin_conn.info.backend_pid,),
                        ).fetchone()[0]
                    )
                elif event == "unpin" and state.pin_conn is not None:
                    state.pin_conn.rollback()
                    state.pin_conn.close()
                    state.pin_conn = None
                    pin_info["closed_at_s"] = round(time.time() - t0, 1)
                elif event.startswith("sample"):
                    minute = int(event.split()[1])
                    sample = _sample_tables(conn, system)
                    sample["minute"] = minute
                    sample["pin_open_at_sample"] = state.pin_conn is not None
                    samples.append(sample)
                    enqueues.read()
                    starts.read()
                    done = sum(
                        1 for s in starts.times.values() if t0 + (minute - 1) * MINUTE <= s < at
                    )
                    print(
                        f"  [{system.name}] minute {minute}: enqueued {len(enqueues.times)}, "
                        f"started {len(starts.times)}, done/s {done / MINUTE:.1f}, "
                        f"dead {sample['n_dead_tup']}, total "
                        f"{sample['total_bytes'] / 1e6:.1f} MB",
                        flush=True,
                    )
            code = enqueuer.wait(timeout=10.0)
            if code is None:
                # it fell behind the offered rate (the system under test took
                # the machine): the run is what it sent by the end
                result["enqueuer_fell_behind"] = True
                enqueuer.stop()
            elif code != 0:
                raise RuntimeError(f"enqueuer exited with {code}:\n{enqueuer.tail()}")
            # drain: every enqueued task started and none left pending or running
            drain_start = time.time()
            deadline = drain_start + settings.drain_timeout
            enqueues.read()
            unfinished = -1
            while True:
                starts.read()
                all_started = all(k in starts.times for k in enqueues.times)
                if all_started:
                    unfinished = conn.execute(system.unfinished_sql).fetchone()[0]
                    if unfinished == 0:
                        break
                if time.time() > deadline:
                    break
                for proc in state.procs:
                    if proc is not enqueuer:
                        proc.check_alive()
                time.sleep(0.5)  # polling interval
            drain_seconds = time.time() - drain_start
            final = _sample_tables(conn, system)
        state.stop()
        rows = _latency_rows(t0, settings.minutes, enqueues.times, starts.times)
        for row, sample in zip(rows, samples, strict=True):
            row.update({k: v for k, v in sample.items() if k != "minute"})
            pin, minute = settings.pin, row["minute"]  # pinned: held during part of it
            row["pinned"] = pin is not None and pin[0] < minute and pin[1] > minute - 1
        n = len(enqueues.times)
        not_started = sum(1 for k in enqueues.times if k not in starts.times)
        result.update(
            {
                "rows": rows,
                "enqueued": n,
                "offered_rate": settings.rate,
                "achieved_enqueue_rate": n / seconds,
                "handler_runs": starts.lines,
                "not_started": not_started,
                "unfinished_at_end": unfinished,
                "drained": not_started == 0 and unfinished == 0,
                "drain_seconds": round(drain_seconds, 1),
                "final": final,
                "bytes_per_task": final["total_bytes"] / n if n else None,
                "pin": pin_info or None,
            }
        )
        return result
    finally:
        state.stop()


# --------------------------------------------------------------- report


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"### {name}\n\nfailed: {result['error'].splitlines()[0]}\n"
    lines = [
        f"### {name} ({result['version']})",
        "",
        "| minute | p50 ms | p99 ms | done/s | dead tuples | table MB | index MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        pin = " (pinned)" if row.get("pinned") else ""
        lines.append(
            f"| {row['minute']}{pin} | {_fmt(row['p50_ms'])} | {_fmt(row['p99_ms'])} "
            f"| {_fmt(row['done_per_s'])} | {row['n_dead_tup']} "
            f"| {_fmt(row['table_bytes'] / 1e6, 2)} | {_fmt(row['index_bytes'] / 1e6, 2)} |"
        )
    final = result["final"]
    lines += [
        "",
        f"enqueued {result['enqueued']} ({result['achieved_enqueue_rate']:.1f}/s offered "
        f"{result['offered_rate']:g}/s); drained: {result['drained']} in "
        f"{result['drain_seconds']} s; after drain: dead {final['n_dead_tup']}, "
        f"total {final['total_bytes'] / 1e6:.2f} MB, "
        f"{_fmt(result['bytes_per_task'], 0)} bytes per finished task",
        "",
    ]
    return "\n".join(lines)


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


# ----------------------------------------------------------------- main


def _server_settings(cluster: Cluster) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        return {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in (
                "server_version", "autovacuum", "fsync", "synchronous_commit",
                "shared_buffers", "max_connections",
            )
        }  # fmt: skip


def _parse_pin(text: str | None) -> tuple[float, float] | None:
    if not text:
        return None
    a, _, b = text.partition(":")
    pin = (float(a), float(b))
    if not 0 <= pin[0] < pin[1]:
        raise argparse.ArgumentTypeError("--pin-horizon-minutes A:B needs 0 <= A < B")
    return pin


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _cleanup_on_sigterm() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS)
    parser.add_argument("--rate", type=float, default=200.0, help="offered tasks/s")
    parser.add_argument("--minutes", type=int, default=30, help="enqueue minutes per system")
    parser.add_argument("--autovacuum", choices=["off", "on"], default="off")
    parser.add_argument("--pin-horizon-minutes", metavar="A:B", help="hold a snapshot A..B")
    parser.add_argument("--drain-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--port", type=int, default=5499)
    parser.add_argument("--label", help="a name for this run in plots [default: file name]")
    parser.add_argument("--output", type=pathlib.Path)
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="all systems at once, each on a cluster of its own (ports --port, --port + 1, ...)",
    )
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    for name in names:
        if not os.access(SYSTEMS[name].python, os.X_OK):
            parser.error(f"{name}: no {SYSTEMS[name].python} (see the docstring for the venvs)")
    pin = _parse_pin(args.pin_horizon_minutes)
    if pin is not None and pin[1] > args.minutes:
        parser.error("--pin-horizon-minutes must end within --minutes")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    output = args.output or RESULTS_DIR / f"{stamp}.json"
    status = _git("status", "--short")
    report: dict[str, Any] = {
        "settings": {
            "label": args.label,
            "started": stamp,
            "rate": args.rate,
            "minutes": args.minutes,
            "autovacuum": args.autovacuum,
            "pin_horizon_minutes": list(pin) if pin else None,
            "lanes": LANES,
            "work_seconds": WORK_SECONDS,
            "git_commit": _git("rev-parse", "HEAD"),
            "git_dirty": bool(status),
            "systems": names,
            "sqla_setup_sql": os.environ.get(SETUP_SQL_ENV) or None,
        },
        "systems": {},
    }
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix="lh-run-"))
    # one cluster for all systems, one after the other; with --parallel one
    # cluster per system (own WAL, buffers and autovacuum), all at once
    autovacuum = args.autovacuum == "on"
    clusters: list[Cluster] = []
    failed = False
    try:
        with _cleanup_on_sigterm():
            for i in range(len(names) if args.parallel else 1):
                clusters.append(Cluster(args.port + i, autovacuum=autovacuum))
                clusters[-1].start()
            report["settings"]["postgres"] = _server_settings(clusters[0])
            report["settings"]["parallel"] = args.parallel
            settings = Settings(args.rate, args.minutes, pin, args.drain_timeout, work_dir)

            def one(name: str, cluster: Cluster) -> bool:
                print(f"== {name} (port {cluster.port})", flush=True)
                began = time.time()
                ok = True
                try:
                    result = run_system(cluster, SYSTEMS[name], settings)
                except (RuntimeError, subprocess.CalledProcessError) as exc:
                    ok = False
                    result = {"error": str(exc)}
                result["wall_seconds"] = round(time.time() - began, 1)
                report["systems"][name] = result
                print(markdown(name, result), flush=True)
                return ok

            if args.parallel:
                with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
                    oks = list(pool.map(one, names, clusters))
            else:
                oks = [one(name, clusters[0]) for name in names]
            failed = not all(oks)
    except KeyboardInterrupt:
        print("interrupted: stopping", file=sys.stderr)
        failed = True
        report["settings"]["interrupted"] = True
    finally:
        for cluster in clusters:
            cluster.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    if report["systems"]:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        _driver_main(sys.argv[1:])
    else:
        sys.exit(main())
