"""Where the time goes between a NOTIFY and an idle worker's handler.

The peer benchmark's (d) measures commit-to-handler at 50 tasks/s; this
splits that path inside the worker, for any checkout of sqla-queue (the
adapter in ``benchmarks/peers`` and ``sqla_queue`` taken from PYTHONPATH)::

    PYTHONPATH=<tree>/benchmarks/peers:<tree> .venv/bin/python \\
        benchmarks/idle_path.py postgresql://postgres@127.0.0.1/idle_path [--tasks 300]

One worker process (one lane) runs with a few methods wrapped to record
``time.perf_counter()``: the LISTEN thread's notification (psycopg's
``Connection.notifies``), ``TaskManager.claim`` (entry and return, for
claims that took a task), psycopg's ``Cursor.execute`` inside it, and the
handler's first line. The parent enqueues one task every 20 ms through the
harness adapter's ``enqueue_one`` (the ORM path) and prints medians in µs:

- ``notify->claim``: the LISTEN thread wakes a lane, the lane starts its claim;
- ``claim``: the claim, split into ``before execute`` (statement, parameters),
  ``execute`` (the round trip and psycopg) and ``after execute`` (rows,
  records);
- ``claim->handler``: the batch's transaction and the handler's wrapping;
- ``notify->handler``: all of it.

The wrappers cost a few µs each, the same for any tree. The database is the
harness adapter's (its table ``bench_fila``), emptied first: give each tree
a database of its own, since an older tree makes the table without the
newer columns.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HARNESS = pathlib.Path(
    os.environ.get("BENCH_HARNESS", pathlib.Path(__file__).parents[2] / "shared" / "bench")
)
RATE = 50.0  # tasks/s, as the harness's (d)


def worker(url: str, out: str) -> int:
    """The instrumented worker: one lane; writes ``event time`` lines to ``out``."""
    import psycopg
    import sqla_queue_adapter as adapter

    import sqla_queue.batch.manager as manager

    events: list[tuple[str, float]] = []
    clock = time.perf_counter

    notifies = psycopg.Connection.notifies

    def notifies_recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        for notification in notifies(self, *args, **kwargs):
            events.append(("notify", clock()))
            yield notification

    claim = manager.TaskManager.claim

    def claim_recorded(self: Any, conn: Any, *, limit: int) -> Any:
        start = clock()
        tasks = claim(self, conn, limit=limit)
        if tasks:
            events.extend((("claim", start), ("claimed", clock())))
        return tasks

    execute = psycopg.Cursor.execute

    def execute_recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return execute(self, *args, **kwargs)
        finally:
            events.extend((("execute", start), ("executed", clock())))

    def handler(self: Any, payload: Any, task: Any, session: Any) -> None:
        events.append(("handler", clock()))

    psycopg.Connection.notifies = notifies_recorded  # type: ignore[method-assign]
    manager.TaskManager.claim = claim_recorded  # type: ignore[method-assign]
    psycopg.Cursor.execute = execute_recorded  # type: ignore[method-assign]
    adapter.NoopWorker.execute = handler  # type: ignore[method-assign,assignment]

    try:  # the worker's own SIGTERM handler stops it; then this writes
        return int(adapter.worker_main([url, "1"]))
    finally:
        with open(out, "w") as f:
            f.writelines(f"{name} {at:.7f}\n" for name, at in events)


def split(path: str) -> dict[str, float]:
    """Median µs of each stretch, over the tasks whose events are complete."""
    with open(path) as f:
        pairs = [line.split() for line in f]
    events = sorted(((name, float(at)) for name, at in pairs), key=lambda event: event[1])
    stretches: dict[str, list[float]] = {
        "notify->claim": [],
        "claim": [],
        "before execute": [],
        "execute": [],
        "after execute": [],
        "claim->handler": [],
        "notify->handler": [],
    }
    task: dict[str, Any] = {}
    for name, at in events:
        if name == "notify":
            task = {"notify": at, "execute": []}
        elif name in ("claim", "claimed", "handler") and "notify" in task:
            task.setdefault(name, at)
        elif name in ("execute", "executed") and "claim" in task and "claimed" not in task:
            task["execute"].append((name, at))
        if "handler" in task and "claimed" in task:
            starts = [at for name, at in task["execute"] if name == "execute"]
            ends = [at for name, at in task["execute"] if name == "executed"]
            if starts and len(starts) == len(ends):
                us = {
                    "notify->claim": task["claim"] - task["notify"],
                    "claim": task["claimed"] - task["claim"],
                    "before execute": starts[0] - task["claim"],
                    "execute": sum(b - a for a, b in zip(starts, ends, strict=True)),
                    "after execute": task["claimed"] - ends[-1],
                    "claim->handler": task["handler"] - task["claimed"],
                    "notify->handler": task["handler"] - task["notify"],
                }
                for key, seconds in us.items():
                    stretches[key].append(seconds * 1e6)
            task = {}
    return {key: round(statistics.median(v)) if v else float("nan") for key, v in stretches.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HARNESS))
    if args.worker_out:
        return worker(args.url, args.worker_out)
    import sqla_queue_adapter as adapter

    adapter.setup(args.url)
    adapter.reset()
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "events.txt")
        log = open(os.path.join(scratch, "worker.log"), "w+")  # noqa: SIM115 - read on failure
        child = subprocess.Popen(
            [sys.executable, __file__, args.url, "--worker-out", out], stderr=log
        )
        try:
            adapter.enqueue_one(-1)  # the warm-up task, then the lane waits
            deadline = time.monotonic() + 60
            while adapter.count_done() < 1:
                if child.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    last = log.read().strip().splitlines()[-1:] or ["no output"]
                    raise SystemExit(f"the worker ran no task: {last[0]}")
                time.sleep(0.05)
            time.sleep(1.0)  # idle: waiting on LISTEN
            start = time.perf_counter() + 0.05
            for i in range(args.tasks):
                delay = start + i / RATE - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                adapter.enqueue_one(i)
            deadline = time.monotonic() + 30
            while adapter.count_done() < args.tasks + 1 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            child.terminate()
            child.wait(30)
            log.close()
            adapter.teardown()
        result = split(out)
    print(" ".join(f"{key}={value}" for key, value in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
