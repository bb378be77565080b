"""A small application used by the tests, in-process and in worker subprocesses.

``build(table)`` makes a fresh declarative Base with a queue model, a business
table and worker classes. Subprocess workers import this module as
``tests.support.app`` and get the table name from ``SQLA_QUEUE_TEST_TABLE``.
"""

from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import QueueMixin, WorkerBase, payload_key


@dataclass
class App:
    Base: type[DeclarativeBase]
    Task: Any
    Effect: Any
    RecordingWorker: type[WorkerBase]
    FailingWorker: type[WorkerBase]
    BlockingWorker: type[WorkerBase]
    KillerWorker: type[WorkerBase]


def started_then_wait_for_go(task_id: int) -> None:
    """A handler's signal that task ``task_id`` started (``started-ID`` in
    ``SQLA_QUEUE_TEST_SIGNAL_DIR``), then its wait for a ``go`` file there."""
    directory = pathlib.Path(os.environ["SQLA_QUEUE_TEST_SIGNAL_DIR"])
    (directory / f"started-{task_id}").touch()
    deadline = time.monotonic() + 60
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go file within 60 s")
        time.sleep(0.01)  # the handler's own work, not a test wait


def build(
    table: str, *, fair_by: tuple[str, ...] = (), payload_keys: dict[str, str] | None = None
) -> App:
    """``payload_keys``: columns of the queue model filled from payload keys
    (attribute -> payload key)."""

    class Base(DeclarativeBase):
        pass

    namespace: dict[str, Any] = {
        "__tablename__": table,
        "__queue_fair_by__": fair_by,
        # each test's own: a queue_configuration that one test fills must not
        # configure the workers of tests running beside it on a shared server
        "__queue_configuration__": f"{table}_configuration",
        **{name: payload_key(key) for name, key in (payload_keys or {}).items()},
    }
    Task: Any = type("Task", (QueueMixin, Base), namespace)

    class Effect(Base):
        """One row per handler run: what 'exactly once' is checked against."""

        __tablename__ = f"{table}_effect"
        id: Mapped[int] = mapped_column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True
        )
        task_id: Mapped[int] = mapped_column(BigInteger)
        chain_id: Mapped[int] = mapped_column(BigInteger)
        note: Mapped[str | None] = mapped_column(String(200))

    class RecordingWorker(WorkerBase):
        """Writes one Effect row per task through the session it is given."""

        model = Task
        retry_interval_minutes = 0
        lease_seconds = float(os.environ.get("SQLA_QUEUE_TEST_LEASE", "30"))

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if isinstance(payload, dict) and payload.get("keyed"):
                # an idempotency key, written first: the row stays locked by
                # this attempt's transaction while the handler works on
                session.execute(
                    text(f"INSERT INTO {table}_keyed (chain_id, task_id) VALUES (:chain, :task)"),
                    {"chain": task.chain_id, "task": task.id},
                )
            if isinstance(payload, dict) and payload.get("sleep"):
                # a task of mixed durations: optionally reads first (its
                # transaction then stays open while it works), then works
                if payload.get("touch"):
                    session.execute(text("SELECT 1"))
                time.sleep(float(payload["sleep"]))
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note=str(payload)[:200]))
            if isinstance(payload, dict) and payload.get("fail"):
                raise RuntimeError(f"asked to fail: {payload['fail']}")
            return None

        def execute_dead(self, payload: Any, task: Any, session: Any) -> str | None:
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="dead"))
            return "dead handled"

    class FailingWorker(RecordingWorker):
        """Writes its Effect row, then fails: the row must roll back."""

        max_retry = 3

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="should vanish"))
            session.flush()
            raise ValueError("handler failed on purpose")

    class BlockingWorker(RecordingWorker):
        """Signals that a task started, then waits for a go file (SIGTERM tests)."""

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            started_then_wait_for_go(task.id)
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="blocked"))
            return None

    class KillerWorker(RecordingWorker):
        """A poison task: its handler kills its own database connection."""

        max_retry = 2

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if isinstance(payload, dict) and payload.get("kill"):
                if session.bind.dialect.name == "postgresql":
                    session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
                else:
                    me = session.execute(text("SELECT CONNECTION_ID()")).scalar()
                    session.execute(text(f"KILL {int(me)}"))
            return super().execute(payload, task, session)

    return App(Base, Task, Effect, RecordingWorker, FailingWorker, BlockingWorker, KillerWorker)


_app = build(
    os.environ.get("SQLA_QUEUE_TEST_TABLE", "fila_teste"),
    # the columns a fair worker claims by (SQLA_QUEUE_TEST_FAIR_BY=tenant)
    fair_by=tuple(filter(None, os.environ.get("SQLA_QUEUE_TEST_FAIR_BY", "").split(","))),
)
Task = _app.Task
Effect = _app.Effect
RecordingWorker = _app.RecordingWorker
FailingWorker = _app.FailingWorker
BlockingWorker = _app.BlockingWorker
KillerWorker = _app.KillerWorker

#: a SQLite statement that runs for hours: a count to 10**10
COUNT_FOR_HOURS = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000000) "
    "SELECT count(*) FROM c"
)


class LongStatementWorker(RecordingWorker):
    """A handler stuck in one long SQLite statement, under a 1 s time limit:
    a read, or (``{"write": true}``) an INSERT whose interruption makes
    SQLite roll back the whole transaction."""

    time_limit_seconds = 1.0
    max_retry = 1

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="should vanish"))
        session.flush()
        if isinstance(payload, dict) and payload.get("write"):
            columns = f"INSERT INTO {Effect.__tablename__} (task_id, chain_id, note) "
            session.execute(text(columns + COUNT_FOR_HOURS.replace("count(*)", "0, 0, count(*)")))
        else:
            session.execute(text(COUNT_FOR_HOURS))
        return None
