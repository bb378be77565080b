"""What the dashboard's task browser API costs on a big table, and what a
dashboard polling it costs a busy worker.

    .venv/bin/python benchmarks/dashboard_api.py [--rows 5000000] [--pages 20]

Fills a fresh PostgreSQL queue table as benchmarks/inspect_cost.py does
(ROWS finished attempts: successes, failed attempts with their retries,
dead-letter runs; 1,000 ready and 50 running), starts the real
``sqla-queue dashboard --read-only`` and times, over HTTP, ``GET
/api/tasks`` (docs/operations.md): the first page, the next PAGES pages
following ``next``, a page from the middle of the table (``after`` = the
middle id), and the first pages filtered by state (succeeded, failed,
dead_letter, ready) and by process; each the median of 5 calls, in ms.
Then ``GET /api/workers`` and ``GET /api/tasks/ID``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import create_engine, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from inspect_cost import TABLE, Base, Task, fill  # noqa: E402

from sqla_queue import WorkerBase  # noqa: E402

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PORT = 8791


class Browse(WorkerBase):
    """The dashboard's worker class: it names the queue model."""

    model = Task

    def execute(self, payload: Any, task: Any, session: Any) -> None:
        """Never run: the benchmark only reads."""


def timed(call: Callable[[], Any], repeat: int = 5) -> tuple[float, Any]:
    seconds, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000, result


def get(path: str, **params: Any) -> dict[str, Any]:
    answer = requests.get(f"http://127.0.0.1:{PORT}{path}", params=params, timeout=30)
    answer.raise_for_status()
    return dict(answer.json())


def wait_for_dashboard(deadline_seconds: float = 60) -> None:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{PORT}/api/status", timeout=2)
            return
        except requests.ConnectionError:
            time.sleep(0.1)  # a server's start, polled with a deadline
    raise TimeoutError("the dashboard did not answer within 60 s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="reuse a filled table")
    args = parser.parse_args()
    engine = create_engine(URL)
    if not args.keep:
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)
        started = time.perf_counter()
        fill(engine, args.rows)
        print(f"filled in {time.perf_counter() - started:.0f} s")
    with engine.connect() as conn:
        total, low, high = conn.execute(
            text(f"SELECT count(*), min(id), max(id) FROM {TABLE}")
        ).one()
    print(f"postgresql: {total:,} rows (autovacuum off; VACUUM ANALYZE once after the fill)")
    server = subprocess.Popen(
        [
            sys.executable, "-m", "sqla_queue.cli", "dashboard", "dashboard_api:Browse",
            "--url", URL, "--read-only", "--port", str(PORT),
        ],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": f"{HERE}:{HERE.parent}"},
    )  # fmt: skip
    try:
        wait_for_dashboard()
        rows: list[tuple[str, float, int]] = []
        ms, page = timed(lambda: get("/api/tasks", limit=50))
        rows.append(("first page", ms, len(page["tasks"])))
        cursor, walked = page["next"], []
        for _ in range(args.pages):
            ms, page = timed(lambda cursor=cursor: get("/api/tasks", limit=50, after=cursor))
            walked.append(ms)
            cursor = page["next"]
        rows.append((f"next {args.pages} pages (median)", statistics.median(walked), 50))
        middle = str((low + high) // 2)
        ms, page = timed(lambda: get("/api/tasks", limit=50, after=middle))
        rows.append(("a page from the middle", ms, len(page["tasks"])))
        for state in ("succeeded", "failed", "dead_letter", "ready", "running"):
            ms, page = timed(lambda state=state: get("/api/tasks", limit=50, state=state))
            rows.append((f"state={state}", ms, len(page["tasks"])))
        ms, page = timed(lambda: get("/api/tasks", limit=50, process="notificar"))
        rows.append(("process=notificar", ms, len(page["tasks"])))
        ms, page = timed(lambda: get("/api/workers"))
        rows.append(("/api/workers", ms, len(page["workers"])))
        ms, _ = timed(lambda: get(f"/api/tasks/{middle}"))
        rows.append(("/api/tasks/ID", ms, 1))
    finally:
        server.terminate()
        server.wait(30)
    print("| call | ms (median of 5) | rows |\n|---|---|---|")
    for what, ms, count in rows:
        print(f"| {what} | {ms:.1f} | {count} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
