"""Enqueue rows per second from Spark against plain Python, in one run.

    python benchmarks/spark_enqueue.py [--url URL] [--rows 200000] [--reps 3]
                                       [--master local[2]] [--mysql-url URL]

Every line writes the same tasks (process, external key, a payload of three
columns: its text and hash computed on the way) into an empty queue table
with its indexes and NOTIFY trigger, on the same machine, and reports the
median of --reps runs:

  Spark enqueue_dataframe            the executors' COPY (PostgreSQL) or batched
                                     INSERTs (MariaDB), a transaction per partition
  Spark enqueue_dataframe, dedupe    + a shuffle by key bucket, bucket locks and
                                     a lookup of every key (the table is empty)
  QueueClient.insert_tasks           one Python process, 10,000 rows per call,
                                     one transaction (COPY on psycopg from 64 rows)
  QueueClient.copy_tasks             the same through COPY explicitly
  psycopg COPY, by hand              the floor from Python: serialise, hash and
                                     write_row, no sqla-queue (ids from the sequence)
  the database alone                 the same rows as COPY text files written before
                                     the clock starts, loaded by 1 or 2 psql \\copy
                                     processes at once: PostgreSQL's own ceiling for
                                     this table on this machine, with no client work

The DataFrame is cached before timing: Spark's time is the enqueue, not the
making of the rows. The session's start (8-30 s on 2 cores) is not counted,
nor the start of the executors' Python workers (a first job of 1,000 rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from sqla_queue import QueueClient, normalize_url
from sqla_queue.client.queue import resolve_table
from sqla_queue.common.payload import hash_payload, serialize_payload
from sqla_queue.spark import enqueue_dataframe, spark_session

TABLE = "bench_spark_enqueue"
CHUNK = 10_000


def payload(i: int) -> dict[str, Any]:
    return {"id": i, "invoice": f"invoice-{i}", "amount": i % 1000}


def timed(run: Callable[[], Any], reset: Callable[[], None], reps: int) -> float:
    """Median seconds of ``run`` over ``reps``, each after ``reset``."""
    seconds = []
    for _ in range(reps):
        reset()
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def bench_database(url: str, frame: Any, rows: list[dict[str, Any]], args: Any) -> None:
    """Print one line per path for the database at ``url``."""
    table = resolve_table(TABLE)
    engine = create_engine(normalize_url(url))

    def reset() -> None:
        table.metadata.drop_all(engine, tables=[table])
        table.metadata.create_all(engine, tables=[table])

    def spark_job(dedupe: bool) -> Callable[[], None]:
        def run() -> None:
            enqueue_dataframe(
                frame,
                url,
                TABLE,
                process="faturar",
                payload_cols=["id", "invoice", "amount"],
                external_key_col="invoice",
                dedupe=dedupe,
            )

        return run

    def client(method: str) -> Callable[[], None]:
        def run() -> None:
            with engine.begin() as conn:
                call = getattr(QueueClient(conn, TABLE), method)
                for start in range(0, len(rows), CHUNK):
                    call(rows[start : start + CHUNK])

        return run

    def copy_by_hand() -> None:
        with engine.begin() as conn:
            raw = conn.connection.dbapi_connection
            assert raw is not None
            ids = conn.execute(
                text(
                    f"SELECT nextval(pg_get_serial_sequence('{TABLE}', 'id')) "
                    "FROM generate_series(1, :n)"
                ),
                {"n": len(rows)},
            ).scalars()
            columns = "id, processo, chave_externa, payload, payload_hash, status, pub_sub"
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY {TABLE} ({columns}) FROM STDIN") as copy,
            ):
                for task_id, row in zip(ids, rows, strict=True):
                    body = serialize_payload(row["payload"])
                    copy.write_row(
                        (task_id, "faturar", row["external_key"], body,
                         hash_payload(body), "pendente", False)
                    )  # fmt: skip

    def server_alone(streams: int) -> Callable[[], None]:
        """The database alone: the same rows as COPY text files made before
        the clock starts, loaded by ``streams`` psql processes at once (no
        Python, no Spark): what the table and the machine allow."""
        columns = "processo, chave_externa, payload, payload_hash, status, pub_sub"
        lines = []
        for row in rows:
            body = serialize_payload(row["payload"]) or ""
            digest = (hash_payload(body) or b"").decode()
            lines.append(
                f"faturar\t{row['external_key']}\t{body.replace(chr(92), chr(92) * 2)}"
                f"\t{digest}\tpendente\tf\n"
            )
        folder = Path(tempfile.mkdtemp(prefix="sqlaq-bench-"))
        files = []
        share = -(-len(lines) // streams)
        for i in range(streams):
            files.append(folder / f"rows.{i}.txt")
            files[-1].write_text("".join(lines[i * share : (i + 1) * share]))
        u = engine.url
        psql = ["psql", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432)]
        psql += ["-U", u.username or "postgres", "-d", u.database or "postgres", "-q", "-c"]
        env = {**os.environ, "PGPASSWORD": u.password or ""}

        def run() -> None:
            procs = [
                subprocess.Popen([*psql, f"\\copy {TABLE} ({columns}) FROM '{f}'"], env=env)
                for f in files
            ]
            if any(proc.wait() != 0 for proc in procs):
                raise RuntimeError("psql \\copy failed")

        return run

    lines: list[tuple[str, Callable[[], None]]] = [
        (f"Spark enqueue_dataframe ({args.master})", spark_job(False)),
        (f"Spark enqueue_dataframe, dedupe ({args.master})", spark_job(True)),
        ("QueueClient.insert_tasks (1 process)", client("insert_tasks")),
    ]
    if engine.dialect.name == "postgresql":
        lines += [
            ("QueueClient.copy_tasks (1 process)", client("copy_tasks")),
            ("psycopg COPY by hand (1 process)", copy_by_hand),
            ("the database alone: psql \\copy of COPY text files, 1 stream", server_alone(1)),
            ("the database alone: psql \\copy of COPY text files, 2 streams", server_alone(2)),
        ]
    # a first small job starts the executors' Python workers (Spark reuses
    # them), which the timed jobs would otherwise count once
    reset()
    enqueue_dataframe(frame.limit(1000), url, TABLE, process="warm-up", payload_cols=["id"])
    for label, run in lines:
        seconds = timed(run, reset, args.reps)
        print(
            f"| {engine.dialect.name} | {label} | {args.rows / seconds:,.0f} | {seconds:.2f} |",
            flush=True,
        )
    table.metadata.drop_all(engine, tables=[table])
    engine.dispose()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--mysql-url", default=None)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    spark = spark_session(args.master, app_name="sqla-queue benchmark")
    frame = spark.range(args.rows).selectExpr(
        "id", "concat('invoice-', id) AS invoice", "id % 1000 AS amount"
    )
    frame = frame.cache()
    frame.count()
    rows = [
        {"process": "faturar", "external_key": f"invoice-{i}", "payload": payload(i)}
        for i in range(args.rows)
    ]
    load = os.getloadavg()[0]
    print(
        f"{args.rows:,} rows, median of {args.reps}, Spark {spark.version} {args.master}, "
        f"load average {load:.1f} at the start\n"
    )
    print("| database | path | rows/s | seconds |\n|---|---|---|---|")
    for url in filter(None, [args.url, args.mysql_url]):
        bench_database(url, frame, rows, args)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
