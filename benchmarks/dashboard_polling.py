"""What a dashboard polling a busy queue costs its worker.

    .venv/bin/python benchmarks/dashboard_polling.py [--tasks 20000] [--reps 3]

On PostgreSQL: TASKS no-op tasks enqueued, then the real ``sqla-queue worker
--burst`` (one process, one lane) runs them all, timed from its start to
its exit; with and without the real ``sqla-queue dashboard --read-only``
beside it, polled as an open browser tab and an API client would: the
overview's ``/api/status`` every 3 s (its live refresh) and ``/api/tasks``,
``/api/workers`` and ``/api/history`` every second. Repetitions
interleaved; tasks per second, median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sqla_queue import QueueClient, QueueMixin, WorkerBase  # noqa: E402

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PORT = 8794


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = "fila_polling"


class Noop(WorkerBase):
    model = Task

    def execute(self, payload: Any, task: Any, session: Any) -> None:
        """Nothing: the queue's own cost is what is measured."""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sqla_queue.cli", *args, "--url", URL]


ENV = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}"}


def fill(engine: Any, tasks: int) -> None:
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        QueueClient(conn, Task).insert_tasks(
            [{"processo": "noop", "payload": {"n": n}} for n in range(tasks)]
        )


def poll(stop: threading.Event, calls: list[int]) -> None:
    base = f"http://127.0.0.1:{PORT}"
    tick = 0
    while not stop.wait(1.0):
        paths = ["/api/tasks?limit=50", "/api/workers", "/api/history?window=hour"]
        if tick % 3 == 0:
            paths.append("/api/status")
        for path in paths:
            requests.get(base + path, timeout=30)
            calls[0] += 1
        tick += 1


def run_once(engine: Any, tasks: int, polled: bool) -> tuple[float, int]:
    fill(engine, tasks)
    board = None
    calls = [0]
    stop = threading.Event()
    poller = threading.Thread(target=poll, args=(stop, calls), daemon=True)
    if polled:
        board = subprocess.Popen(
            _cli("dashboard", "dashboard_polling:Noop", "--read-only", "--port", str(PORT)),
            cwd=HERE,
            env=ENV,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the dashboard's start
            try:
                requests.get(f"http://127.0.0.1:{PORT}/api/status", timeout=2)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        poller.start()
    started = time.perf_counter()
    subprocess.run(
        _cli("worker", "dashboard_polling:Noop", "--burst"),
        cwd=HERE,
        env=ENV,
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - started
    stop.set()
    if board is not None:
        poller.join(30)
        board.terminate()
        board.wait(30)
    return tasks / seconds, calls[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    engine = create_engine(URL)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(args.reps):
        for polled in (False, True):
            rate, calls = run_once(engine, args.tasks, polled)
            rates[polled].append(rate)
            what = f"polled ({calls} calls)" if polled else "alone"
            print(f"rep {rep + 1} {what}: {rate:,.0f} tasks/s", flush=True)
    for polled, found in rates.items():
        label = "with a dashboard polling" if polled else "alone"
        shown = " / ".join(f"{r:,.0f}" for r in found)
        print(f"{label}: median {statistics.median(found):,.0f} tasks/s ({shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
