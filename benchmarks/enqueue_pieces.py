"""CPU time per enqueue of the pieces of the ORM path, PostgreSQL.

    .venv/bin/python benchmarks/enqueue_pieces.py [--url URL]

Runs on the peer harness's sqla-queue adapter (benchmarks/peers) against a
database of its own (``bench_pieces``, made afresh), each piece 2,000 times
after 200 to warm up, twice in turn: what a bare connection's transaction,
an empty Session, ``QueueClient.insert_task`` and the ORM enqueue cost in
client CPU (user + system of this process: the server's time is not in
it). docs/benchmarks.md, "The gaps", has a run and what it shows.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def harness_adapter(url: str) -> Any:
    """The peer harness's sqla-queue adapter (benchmarks/peers), set up on
    ``url``'s database made afresh (PostgreSQL)."""
    database = url.rsplit("/", 1)[1]
    for sql in (f"DROP DATABASE IF EXISTS {database}", f"CREATE DATABASE {database}"):
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc", sql], check=True
        )
    sys.path[:0] = [str(HERE / "peers"), str(HERE.parent.parent / "shared" / "bench")]
    import sqla_queue_adapter as adapter  # type: ignore[import-not-found]

    adapter.setup(url)
    return adapter


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/bench_pieces")
    args = parser.parse_args()
    adapter = harness_adapter(args.url)
    from sqlalchemy.orm import Session

    from sqla_queue import QueueClient
    from sqla_queue.enqueue.events import prepare_task

    conn, task = adapter._conn, adapter.Task

    def bare_transaction() -> None:
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")

    def empty_session_select() -> None:
        with Session(bind=conn) as session, session.begin():
            session.connection().exec_driver_sql("SELECT 1")

    def task_prepared() -> None:
        prepare_task(task(process="noop", payload=1))

    def insert_task() -> None:
        with conn.begin():
            QueueClient(conn, task).insert_task(None, None, "noop", None, 1)

    def orm_enqueue() -> None:
        adapter.enqueue_one(1)

    pieces: list[Any] = [
        task_prepared,
        bare_transaction,
        empty_session_select,
        insert_task,
        orm_enqueue,
    ]
    print("| piece | µs CPU per call, run 1 | run 2 |\n|---|---:|---:|")
    results: dict[str, list[float]] = {}
    for _ in range(2):
        for piece in pieces:
            for _ in range(200):
                piece()
            started = time.process_time()
            for _ in range(2000):
                piece()
            results.setdefault(piece.__name__, []).append(
                (time.process_time() - started) / 2000 * 1e6
            )
    for name, values in results.items():
        print(f"| {name} | {values[0]:.0f} | {values[1]:.0f} |")
    adapter.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
