"""sqla-queue's async worker in the peer benchmark harness (../shared/bench).

Everything but the workers comes from sqla_queue_adapter (the same table,
enqueue and counts). workers: ``python -m sqla_queue_async_adapter worker URL
LANES`` runs a WorkerBase subclass whose no-op ``execute`` is ``async def``:
LANES coroutine lanes on one event loop per process (psycopg 3's async mode),
batched as the sync worker is.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import benchlib
import sqla_queue_adapter as _base
from sqla_queue_adapter import (  # noqa: F401  (the harness's adapter contract)
    BULK_CHUNK,
    ENQUEUE_DESC,
    count_done,
    count_jobs,
    enqueue_bulk,
    enqueue_one,
    preload,
    recover,
    reset,
    setup,
    stop_workers,
    teardown,
    version,
)

from sqla_queue import TaskRecord, WorkerBase

PEER = "sqla_queue (async)"
WORKER_SETTINGS = [
    {"label": "1 proc (batched, 1 coroutine lane)", "procs": 1, "concurrency": 1},
    {"label": "1 proc (batched, 4 coroutine lanes)", "procs": 1, "concurrency": 4},
    {"label": "4 procs (batched, 1 coroutine lane each)", "procs": 4, "concurrency": 1},
]
LATENCY_SETTING = 0
NOTES = _base.NOTES.replace("one thread (lane)", "one coroutine lane (async def execute)")


class AsyncNoopWorker(WorkerBase):
    model = _base.Task

    async def execute(self, payload: Any, task: TaskRecord, session: Any) -> str | None:
        benchlib.task_started(payload)
        return None


def start_workers(procs: int, concurrency: int) -> benchlib.WorkerGroup:
    assert _base._url is not None
    args = ["sqla_queue_async_adapter", "worker", _base._url, str(int(concurrency))]
    return benchlib.spawn_workers(PEER, args, procs)


def worker_main(argv: list[str]) -> int:
    """``worker URL LANES``"""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return AsyncNoopWorker().run(argv[0], concurrency=int(argv[1]))


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    sys.exit(worker_main(sys.argv[2:]))
