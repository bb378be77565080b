"""The enqueue with and without the INSERT handed to libpq, in one process.

    .venv/bin/python benchmarks/enqueue_ab.py [--rounds 30] [--n 200] [--url URL]

On the peer harness's sqla-queue adapter (benchmarks/peers), against a
database of its own (``bench_ab``, made afresh): the ORM enqueue and
``QueueClient.insert_task``, each ``--n`` times with
``SQLA_QUEUE_LIBPQ_INSERT`` true and then false, alternating for
``--rounds`` rounds, so that the machine's drift (this VM's speed changes
by tens of percent within minutes) falls on both sides alike. Prints the
medians of wall time and client CPU (user + system of this process) per
enqueue. docs/payload.md ("How a new task is written") has a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from enqueue_pieces import harness_adapter


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/bench_ab")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    orm = harness_adapter(args.url)
    import sqla_queue_client_adapter as client  # type: ignore[import-not-found]

    paths: dict[str, Any] = {"ORM enqueue": orm.enqueue_one, "insert_task": client.enqueue_one}
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for path, enqueue in paths.items():
            for libpq in ("true", "false"):
                os.environ["SQLA_QUEUE_LIBPQ_INSERT"] = libpq
                wall, cpu = time.perf_counter(), time.process_time()
                for seq in range(args.n):
                    enqueue(seq)
                per = (
                    (time.perf_counter() - wall) / args.n * 1e6,
                    (time.process_time() - cpu) / args.n * 1e6,
                )
                found.setdefault((path, libpq), []).append(per)
    orm.teardown()
    print("| path | libpq INSERT | µs a task (median) | client CPU µs (median) |")
    print("|---|---|---:|---:|")
    for (path, libpq), runs in found.items():
        wall = statistics.median(run[0] for run in runs)
        cpu = statistics.median(run[1] for run in runs)
        print(f"| {path} | {libpq} | {wall:,.0f} | {cpu:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
