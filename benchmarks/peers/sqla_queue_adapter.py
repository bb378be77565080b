"""sqla-queue adapter for the peer benchmark harness (../shared/bench).

enqueue_one: the ORM path in the application's own transaction, on its
    long-lived connection (as every peer's enqueue runs in the harness):
    with Session(bind=conn) as s, s.begin(): s.add(Task(process="noop", payload=seq))
    (``sqla_queue.install(Session)`` completes the row on flush).
enqueue_bulk: ``QueueClient(conn, Task).copy_tasks([...])`` (COPY) on PostgreSQL,
    ``insert_tasks`` elsewhere; one transaction per chunk of BULK_CHUNK, on a
    long-lived Connection (psycopg 3). The QueueClient adapter measures
    ``insert_tasks`` on PostgreSQL.
workers: ``python -m sqla_queue_adapter worker URL LANES [BATCH_SIZE]`` runs a
    WorkerBase subclass whose no-op ``execute`` returns None. Idle lanes wait
    on LISTEN/NOTIFY on PostgreSQL, and poll (SQLA_QUEUE_POLL_INTERVAL) on
    databases without NOTIFY.

The adapter is also driven on MariaDB and SQLite by ``benchmarks/own_dialects.py``;
the queue table name then comes from BENCH_SQLA_QUEUE_TABLE (read at import,
inherited by the worker processes).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from importlib.metadata import version as _v
from pathlib import Path
from typing import Any

import benchlib
from sqlalchemy import Connection, Engine, create_engine, delete, func, select, text
from sqlalchemy.orm import DeclarativeBase, Session

import sqla_queue
from sqla_queue import (
    DEFAULT_PRIORITY,
    QueueClient,
    QueueMixin,
    Status,
    TaskRecord,
    WorkerBase,
    normalize_url,
)

PEER = "sqla_queue"
TABLE = os.environ.get("BENCH_SQLA_QUEUE_TABLE", "bench_fila")
BULK_CHUNK = 1000


class Lanes(int):
    """The ``concurrency`` of a worker setting (lanes per process) that also
    carries a batch size for the worker command line. The driver passes
    ``setting["concurrency"]`` to start_workers() as is; it is stored in the
    results JSON as a plain number."""

    batch_size: int | None

    def __new__(cls, lanes: int, batch_size: int | None = None) -> Lanes:
        obj = super().__new__(cls, lanes)
        obj.batch_size = batch_size
        return obj


WORKER_SETTINGS = [
    {"label": "1 proc (batched, 1 lane)", "procs": 1, "concurrency": Lanes(1)},
    {
        "label": "1 proc, batch_size=1 (one task per transaction)",
        "procs": 1,
        "concurrency": Lanes(1, batch_size=1),
        "batch_size": 1,
    },
    {"label": "4 procs (batched, 1 lane each)", "procs": 4, "concurrency": Lanes(1)},
]
LATENCY_SETTING = 0
ENQUEUE_DESC = (
    'with Session(bind=conn) as s, s.begin(): s.add(Task(process="noop", payload=seq))'
    " (ORM on the app's connection, psycopg 3)"
)


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = TABLE


class NoopWorker(WorkerBase):
    model = Task

    def execute(self, payload: Any, task: TaskRecord, session: Session) -> str | None:
        benchlib.task_started(payload)
        return None


_url: str | None = None
_engine: Engine | None = None
_conn: Connection | None = None  # the application's long-lived connection
_admin: Connection | None = None  # autocommit: counts, TRUNCATE


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(sqla_queue.__file__).parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def version() -> str:
    commit = _git_commit()
    return _v("sqla-queue") + (f" ({commit})" if commit else "")


NOTES = (
    f"SQLAlchemy {_v('SQLAlchemy')}, psycopg {_v('psycopg')}; worker: one thread (lane) "
    "per process, batches of up to WorkerBase.batch_size=100 tasks per transaction "
    "(adaptive), LISTEN/NOTIFY wake-up"
)


def _execute(statement: Any, params: dict[str, Any] | None = None) -> Any:
    """Run on the autocommit admin connection; the result."""
    assert _admin is not None
    return _admin.execute(statement, params or {})


def setup(db_url: str) -> None:
    global _url, _engine, _conn, _admin
    _url = db_url
    _engine = create_engine(normalize_url(db_url))
    sqla_queue.install(Session)
    Base.metadata.create_all(_engine)
    _conn = _engine.connect()
    _admin = _engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def _dialect() -> str:
    assert _engine is not None
    return _engine.dialect.name


def _quoted_table() -> str:
    assert _engine is not None
    return _engine.dialect.identifier_preparer.format_table(Task.__table__)


def reset() -> None:
    if _dialect() == "sqlite":  # no TRUNCATE; the id restarts after max(id) anyway
        _execute(delete(Task.__table__))
    elif _dialect() == "postgresql":
        _execute(text(f"TRUNCATE {_quoted_table()} RESTART IDENTITY"))
    else:  # MySQL/MariaDB: TRUNCATE resets AUTO_INCREMENT
        _execute(text(f"TRUNCATE TABLE {_quoted_table()}"))


def recover() -> None:
    for conn in (_conn, _admin):
        if conn is not None and conn.in_transaction():
            conn.rollback()


def enqueue_one(seq: int | None = None) -> None:
    # the application's Session on its own long-lived connection, as the
    # harness runs every peer's enqueue ("on the app's connection")
    with Session(bind=_conn) as s, s.begin():
        s.add(Task(process="noop", payload=seq))


def enqueue_bulk(n: int, *, copy: bool | None = None) -> None:
    """Chunks of BULK_CHUNK, one transaction each: ``copy_tasks`` (COPY) on
    PostgreSQL, ``insert_tasks`` elsewhere or when ``copy`` is False."""
    assert _conn is not None
    if copy is None:
        copy = _dialect() == "postgresql"
    for start in range(0, n, BULK_CHUNK):
        k = min(BULK_CHUNK, n - start)
        with _conn.begin():
            client = QueueClient(_conn, Task)
            rows = [{"process": "noop"}] * k
            if copy:
                client.copy_tasks(rows)
            else:
                client.insert_tasks(rows)


def preload(n: int) -> None:
    """Untimed pre-load for (c): on PostgreSQL one INSERT ... SELECT writing
    what insert_task(None, None, "noop", None, None) writes (the other columns
    take their server defaults); elsewhere through enqueue_bulk()."""
    if _dialect() != "postgresql":
        enqueue_bulk(n)
        return
    _execute(
        text(
            f"INSERT INTO {_quoted_table()} (processo, payload, payload_hash, status, prioridade, "
            "pub_sub) SELECT 'noop', NULL, NULL, :status, :priority, false "
            "FROM generate_series(1, :n)"
        ),
        {"status": Status.PENDING.value, "priority": DEFAULT_PRIORITY, "n": n},
    )


_COUNT_JOBS = select(func.count()).select_from(Task.__table__)
_COUNT_DONE = _COUNT_JOBS.where(Task.__table__.c.status == Status.SUCCEEDED.value)


def count_jobs() -> int:
    return int(_execute(_COUNT_JOBS).scalar())


def count_done() -> int:
    return int(_execute(_COUNT_DONE).scalar())


def start_workers(procs: int, concurrency: int) -> benchlib.WorkerGroup:
    assert _url is not None
    args = ["sqla_queue_adapter", "worker", _url, str(int(concurrency))]
    batch_size = getattr(concurrency, "batch_size", None)
    if batch_size:
        args.append(str(batch_size))
    return benchlib.spawn_workers(PEER, args, procs)


def stop_workers(handle: benchlib.WorkerGroup) -> None:
    handle.stop()


def teardown() -> None:
    for conn in (_conn, _admin):
        if conn is not None:
            conn.close()
    if _engine is not None:
        _engine.dispose()


def worker_main(argv: list[str]) -> int:
    """``worker URL LANES [BATCH_SIZE]``"""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url, lanes = argv[0], int(argv[1])
    batch_size = int(argv[2]) if len(argv) > 2 else None
    return NoopWorker().run(url, concurrency=lanes, batch_size=batch_size)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    sys.exit(worker_main(sys.argv[2:]))
