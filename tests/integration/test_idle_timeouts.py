"""A server that ends idle sessions quickly fails no healthy task.

PostgreSQL's ``idle_session_timeout`` ends a session idle outside a
transaction, ``idle_in_transaction_session_timeout`` one idle inside one.
A lane's work connection is both by design (between tasks, and while a
handler works before or after its first statement), and the LISTEN
connection is idle all the time: the worker turns both off for its own
sessions (docs/lifecycle.md, "Idle timeouts"). The database here has both
at 300 ms, set on a database of the test's own so that nothing else feels
them; the handlers work 1 s.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.pool import NullPool

from sqla_queue.config.settings import Settings
from sqla_queue.worker import Runner
from sqla_queue.worker.aio import AsyncRunner
from tests.conftest import server_url, wait_until
from tests.integration.test_worker import effects, enqueue
from tests.support.app import App
from tests.support.async_app import build as build_async

IDLE_MS = 300


@pytest.fixture
def idle_engine(app: App) -> Iterator[Engine]:
    """An engine on a new database whose sessions end after IDLE_MS idle."""
    admin_url = server_url("postgresql")
    name = f"sqlaq_idle_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    # as the CLI makes it (settings.py): a pooled connection the server ended
    # while it sat in the pool is replaced at checkout
    engine = create_engine(admin.url.set(database=name), pool_pre_ping=True)
    try:
        # the tables first: create_all's one transaction, on a loaded
        # machine, may sit idle longer than IDLE_MS between two statements
        app.Base.metadata.create_all(engine)
        engine.dispose()
        with admin.connect() as conn:
            for setting in ("idle_session_timeout", "idle_in_transaction_session_timeout"):
                conn.execute(text(f'ALTER DATABASE "{name}" SET {setting} = {IDLE_MS}'))
        yield engine  # its sessions from here on start with both timeouts
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _listeners(engine: Engine) -> list[tuple[int, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT pid, backend_start FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
        )
        return [(row[0], row[1]) for row in rows]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_handlers_that_work_idle_and_the_listen_connection_outlive_the_idle_timeouts(
    idle_engine: Engine, app: App, installed: None, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    engine = idle_engine
    # the test's own reads, each on a new connection (the server ends idle ones)
    reader = create_engine(engine.url, poolclass=NullPool)
    with reader.connect() as conn:  # the setting reached the sessions of this database
        assert conn.execute(text("SHOW idle_session_timeout")).scalar() == f"{IDLE_MS}ms"
    if kind == "sync":
        runner = Runner.for_worker(
            app.RecordingWorker(), engine=engine, concurrency=2, settings=Settings()
        )
    else:
        worker = build_async(app).Recording()
        runner = AsyncRunner.for_worker(worker, engine=engine, concurrency=2, settings=Settings())
    thread = threading.Thread(target=runner.run)
    caplog.set_level(logging.WARNING)
    thread.start()
    try:
        wait_until(lambda: len(_listeners(reader)) == 1, message="the LISTEN connection")
        [listener] = _listeners(reader)
        ids = enqueue(
            reader,
            app,
            {"sleep": 1.0},  # works before its first statement
            {"sleep": 1.0, "touch": True},  # reads first, then works in its transaction
        )
        wait_until(
            lambda: sorted(task_id for task_id, _, _ in effects(reader, app)) == sorted(ids),
            timeout=60,
            message="both tasks done",
        )
        # idle again between tasks: the lanes' connections must still serve
        ids += enqueue(reader, app, {"sleep": 1.0}, {"sleep": 1.0, "touch": True})
        wait_until(
            lambda: sorted(task_id for task_id, _, _ in effects(reader, app)) == sorted(ids),
            timeout=60,
            message="the next two tasks done",
        )
        assert _listeners(reader) == [listener]  # never ended and made again
    finally:
        runner.stop()
        thread.join(60)
    assert not thread.is_alive()
    with reader.connect() as conn:
        rows = conn.execute(select(app.Task.status, app.Task.attempt)).all()
    assert sorted(rows) == [("sucesso", 1)] * 4  # each at its first attempt
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert lost == []
    reader.dispose()
