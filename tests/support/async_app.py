"""Async workers on the test application's queue (tests/support/app.py).

``build(app)`` makes the async twins of the app's workers on its Task and
Effect models; worker subprocesses import this module and get the table
from ``SQLA_QUEUE_TEST_TABLE``, as with ``tests.support.app``.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from sqla_queue import WorkerBase
from tests.support import app as sync_app


@dataclass
class AsyncApp:
    Recording: type[WorkerBase]
    Failing: type[WorkerBase]
    Sleeping: type[WorkerBase]
    Blocking: type[WorkerBase]
    Killer: type[WorkerBase]
    Slow: type[WorkerBase]
    HoldsLoop: type[WorkerBase]


async def started_then_wait_for_go(task_id: int) -> None:
    """:func:`tests.support.app.started_then_wait_for_go` for a coroutine:
    the wait awaits, so the other lanes run meanwhile."""
    directory = pathlib.Path(os.environ["SQLA_QUEUE_TEST_SIGNAL_DIR"])
    (directory / f"started-{task_id}").touch()
    deadline = time.monotonic() + 60
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go file within 60 s")
        await asyncio.sleep(0.01)  # the handler's own work, not a test wait


def build(app: Any) -> AsyncApp:
    Effect = app.Effect

    class Recording(WorkerBase):
        """Writes one Effect row per task through its AsyncSession, reads it
        back through the same transaction, and awaits a little I/O."""

        model = app.Task
        retry_interval_minutes = 0
        lease_seconds = float(os.environ.get("SQLA_QUEUE_TEST_LEASE", "30"))

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if isinstance(payload, dict) and payload.get("sleep"):
                # a task of mixed durations (as the sync RecordingWorker's)
                if payload.get("touch"):
                    await session.execute(text("SELECT 1"))
                await asyncio.sleep(float(payload["sleep"]))
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note=str(payload)[:200]))
            await session.flush()
            seen = await session.scalar(
                text(f"SELECT count(*) FROM {Effect.__tablename__} WHERE task_id = :t"),
                {"t": task.id},
            )
            await asyncio.sleep(0)
            if isinstance(payload, dict) and payload.get("fail"):
                raise RuntimeError(f"asked to fail: {payload['fail']}")
            return f"seen {seen}"

        async def execute_dead(self, payload: Any, task: Any, session: Any) -> str | None:
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="dead"))
            return "dead handled"

    class Failing(Recording):
        """Writes its Effect row, then fails: the row must roll back."""

        max_retry = 3

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="should vanish"))
            await session.flush()
            raise ValueError("handler failed on purpose")

    class Sleeping(Recording):
        """Awaits ``payload["sleep"]`` seconds of I/O, then writes its row."""

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            await asyncio.sleep(float(payload.get("sleep", 0.05)))
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="slept"))
            return None

    class Blocking(Recording):
        """Signals that a task started, then awaits a go file (SIGTERM tests)."""

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            await started_then_wait_for_go(task.id)
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="blocked"))
            return None

    class Killer(Recording):
        """A poison task: its handler kills its own database connection."""

        max_retry = 2

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            if isinstance(payload, dict) and payload.get("kill"):
                if session.bind.dialect.name == "postgresql":
                    await session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
                else:
                    me = await session.scalar(text("SELECT CONNECTION_ID()"))
                    await session.execute(text(f"KILL {int(me)}"))
            return await super().execute(payload, task, session)

    class Slow(Recording):
        """Writes its row, then awaits for an hour: past its 1 s time limit."""

        time_limit_seconds = 1.0
        max_retry = 1

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            session.add(Effect(task_id=task.id, chain_id=task.chain_id, note="should vanish"))
            await session.flush()
            await asyncio.sleep(3600)
            return None

    class HoldsLoop(Recording):
        """Blocks the event loop with a sync sleep (the mistake the warning names)."""

        blocking_warning_seconds = 0.2

        async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            time.sleep(float(payload.get("hold", 0.6)))  # the handler's mistake, on purpose
            return await super().execute(payload, task, session)

    return AsyncApp(Recording, Failing, Sleeping, Blocking, Killer, Slow, HoldsLoop)


_app = build(sync_app._app)
Recording = _app.Recording
Failing = _app.Failing
Sleeping = _app.Sleeping
Blocking = _app.Blocking
Killer = _app.Killer
