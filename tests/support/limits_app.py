"""A worker with a fleet-wide concurrency limit of 2 on process
``limitado`` (sqla_queue/policies/limits.py), on the table named by
``SQLA_QUEUE_TEST_TABLE``. Each handler counts itself in and out of a
counter per process shared by every worker process (a file under
``SQLA_QUEUE_TEST_PROBE``, updated under ``flock``), holding its task for
``HOLD_SECONDS``, and keeps the largest count seen: the limit test reads it."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from tests.support.app import RecordingWorker, started_then_wait_for_go
from tests.support.async_app import Recording as AsyncRecording

LIMIT = 2
#: the rate limit's tasks per second
RATE = 20.0
#: the work a task stands for: long enough for lanes to overlap
HOLD_SECONDS = 0.05


def _update(process: str, step: int) -> None:
    path = Path(os.environ["SQLA_QUEUE_TEST_PROBE"]) / f"{process}.count"
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now, most = (int(x) for x in (path.read_text().split() if path.exists() else ["0", "0"]))
        now += step
        path.write_text(f"{now} {max(most, now)}")


@contextlib.contextmanager
def counted(process: str) -> Iterator[None]:
    _update(process, 1)
    try:
        yield
    finally:
        _update(process, -1)


def most_at_once(probe: Path, process: str) -> int:
    path = probe / f"{process}.count"
    return int(path.read_text().split()[1]) if path.exists() else 0


class LimitedWorker(RecordingWorker):
    concurrency_limits: ClassVar[dict[str, int]] = {"limitado": LIMIT}
    batch_size = 4

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        with counted(str(task.process)):
            time.sleep(HOLD_SECONDS)  # the task's work (not a wait for something)
        return super().execute(payload, task, session)


class AsyncLimitedWorker(AsyncRecording):
    """:class:`LimitedWorker` with an async handler: coroutine lanes."""

    concurrency_limits: ClassVar[dict[str, int]] = {"limitado": LIMIT}
    batch_size = 4

    async def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        with counted(str(task.process)):
            await asyncio.sleep(HOLD_SECONDS)  # the task's work
        return await super().execute(payload, task, session)


class KeyLimitedWorker(RecordingWorker):
    """Fair by tenant, at most 2 running tasks of each tenant across the
    fleet; counts itself per tenant and over all tenants."""

    fair_by = "tenant"
    key_concurrency_limit = LIMIT
    batch_size = 4

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        with counted(f"tenant-{task.tenant}"), counted("all"):
            time.sleep(HOLD_SECONDS)  # the task's work (not a wait for something)
        return super().execute(payload, task, session)


class DrainWorker(RecordingWorker):
    """One at a time, fast tasks, big batches: its claims always stop at the
    limit well short of the batch size."""

    concurrency_limits: ClassVar[dict[str, int]] = {"limitado": 1}
    batch_size = 50


def _span(process: str, task_id: int, start: float, end: float) -> None:
    path = Path(os.environ["SQLA_QUEUE_TEST_PROBE"]) / "spans"
    with open(path, "a") as spans:
        fcntl.flock(spans, fcntl.LOCK_EX)
        spans.write(f"{process} {task_id} {start!r} {end!r}\n")


def spans(probe: Path) -> list[tuple[str, int, float, float]]:
    """(process, task id, start, end) of every handler run that returned."""
    path = probe / "spans"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(p, int(i), float(a), float(b)) for p, i, a, b in (x.split() for x in lines if x)]


class OneAtATimeWorker(RecordingWorker):
    """One ``limitado`` task at a time across the fleet. A task whose
    payload says ``block`` signals that it started (``started-ID`` in
    ``SQLA_QUEUE_TEST_SIGNAL_DIR``) and waits for a ``go`` file there; every
    run that returns writes its span."""

    concurrency_limits: ClassVar[dict[str, int]] = {"limitado": 1}

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        start = time.time()
        if isinstance(payload, dict) and payload.get("block"):
            started_then_wait_for_go(int(task.id))
        time.sleep(HOLD_SECONDS)  # the task's work
        result = super().execute(payload, task, session)
        _span(str(task.process), int(task.id), start, time.time())
        return result


class RatedWorker(RecordingWorker):
    """At most 20 ``medido`` tasks a second across the fleet; each run
    writes its span (no work of its own: only the limit slows them)."""

    rate_limits: ClassVar[dict[str, float]] = {"medido": RATE}
    batch_size = 8

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        start = time.time()
        result = super().execute(payload, task, session)
        _span(str(task.process), int(task.id), start, time.time())
        return result


class KeyRatedWorker(RecordingWorker):
    """Fair by tenant, at most 20 tasks of each tenant claimed a second
    across the fleet; each run writes its span under its tenant."""

    fair_by = "tenant"
    key_rate_limit = RATE
    batch_size = 8

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        start = time.time()
        result = super().execute(payload, task, session)
        _span(f"tenant-{task.tenant}", int(task.id), start, time.time())
        return result


class FairFleetWorker(RecordingWorker):
    """Fair by tenant, at most 2 running tasks and 200 claimed a second per
    tenant: the fleet fault test's worker for the fair and limited claims
    (their locks, transactions and token buckets, through faults)."""

    fair_by = "tenant"
    key_concurrency_limit = LIMIT
    key_rate_limit = 200.0
