"""Where a worker's time goes: processing N pre-loaded no-op tasks in burst mode.

    .venv/bin/pip install py-spy
    .venv/bin/py-spy record --idle --rate 250 --format raw -o /tmp/worker.folded -- \
        .venv/bin/python benchmarks/profile_worker.py [--url URL] [--tasks 20000]
    .venv/bin/python benchmarks/profile_worker.py --summarise /tmp/worker.folded

py-spy samples every thread (the lanes are threads; ``--idle`` keeps the
samples of a thread blocked on the socket); ``--summarise`` folds
the samples into shares of the lane's time: waiting on the database, the
driver, SQLAlchemy Core, the ORM Session given to handlers, sqla-queue.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

# the growth benchmark's queue model and no-op worker (this script's folder
# is on sys.path when it runs as a script)
from growth import TABLE, Base, Noop  # type: ignore[import-not-found]
from sqlalchemy import create_engine, text

from sqla_queue import normalize_url

# the first matching rule names a sample's category (checked from the leaf up)
CATEGORIES = [
    # psycopg's wait() blocks in C on the socket: a leaf there is time spent
    # waiting for the server (the round trips, the server's work, the fsync)
    ("waiting on the database (socket)", ("wait (psycopg/connection.py", "psycopg/waiting")),
    ("psycopg (driver)", ("psycopg/",)),
    ("sqla_queue: manager/adapter/records", ("sqla_queue/",)),
    ("SQLAlchemy ORM Session (per task)", ("sqlalchemy/orm/",)),
    ("SQLAlchemy Core (execute, compile cache, results)", ("sqlalchemy/",)),
]


def summarise(path: str) -> None:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as folded:
        lines = folded.readlines()
    for line in lines:
        stack, _, n = line.rstrip().rpartition(" ")
        if "sqla-queue-lane" not in stack and "_lane" not in stack:
            continue  # the main thread only waits for the lanes
        frames = stack.split(";")
        total += int(n)
        for frame in reversed(frames):
            name = next((c for c, keys in CATEGORIES if any(k in frame for k in keys)), None)
            if name:
                counts[name] += int(n)
                break
        else:
            counts["other (Python, threading)"] += int(n)
    print(f"lane samples: {total}")
    print("| where | share of the lane's time |\n|---|---|")
    for name, n in counts.most_common():
        print(f"| {name} | {100 * n / total:.0f}% |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--summarise", metavar="FOLDED")
    args = ap.parse_args()
    if args.summarise:
        summarise(args.summarise)
        return 0
    url = normalize_url(args.url)
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            text(f"INSERT INTO {TABLE} (processo) SELECT 'noop' FROM generate_series(1, :n)"),
            {"n": args.tasks},
        )
    started = time.perf_counter()
    Noop().run(url, burst=True, batch_size=args.batch_size)
    seconds = time.perf_counter() - started
    print(f"{args.tasks} tasks in {seconds:.2f} s: {args.tasks / seconds:,.0f}/s")
    Base.metadata.drop_all(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
