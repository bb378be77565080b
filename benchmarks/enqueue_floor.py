"""Where the time of an enqueue goes, on PostgreSQL: one task per
transaction (target a), then 1,000 per transaction (target b).

    python benchmarks/enqueue_floor.py [--url URL] [--n 3000] [--reps 3]

Each line is BEGIN, one INSERT, COMMIT on one long-lived connection, n
times, after a warm-up; the median of --reps runs, in jobs/s and in
microseconds per job. From the bare driver up to the ORM path, so the cost
of each layer shows as a difference between two lines:

  psycopg, empty transaction BEGIN; SELECT 1; COMMIT: three round trips, no WAL flush
  psycopg, plain table       the floor: three round trips and a commit
  psycopg, queue table       + the queue table's indexes and NOTIFY trigger
  SQLAlchemy Core, plain     + SQLAlchemy's Connection and compiled-statement cache
  SQLAlchemy ORM, plain      + the ORM unit of work (a 3-column model)
  QueueClient.insert_task    sqla-queue's Core path on the queue table
  ORM Task (sqla-queue)      sqla-queue's ORM path (flush hook, 27 columns)

The bulk table, in rows per second for chunks of 1,000 rows:

  COPY, unlogged table without indexes   the client and protocol floor
  COPY, queue table                      + the heap, WAL, indexes and trigger
                                         (ids drawn from the sequence first)
  copy_tasks / insert_tasks              sqla-queue (insert_tasks is COPY from
                                         COPY_THRESHOLD rows on psycopg)
  insert_tasks as INSERT ... unnest      the path below the threshold or when
                                         statements are watched
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import BigInteger, Connection, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sqla_queue
from sqla_queue import QueueClient, QueueMixin, normalize_url
from sqla_queue.adapters.postgresql import PostgresAdapter


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = "bench_floor_queue"


class Plain(Base):
    __tablename__ = "bench_floor_plain"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    processo: Mapped[str] = mapped_column(String(250))
    payload: Mapped[str | None]


def rate(job: Callable[[int], None], n: int, reps: int) -> float:
    for i in range(min(300, n)):
        job(i)
    rates = []
    for _ in range(reps):
        started = time.perf_counter()
        for i in range(n):
            job(i)
        rates.append(n / (time.perf_counter() - started))
    return statistics.median(rates)


BULK_CHUNK = 1000
_COPY_COLUMNS = "id, processo, prioridade, pub_sub, status"


def bulk_rate(chunk: Callable[[], None], chunks: int, reps: int) -> float:
    """Rows per second, BULK_CHUNK rows per call of ``chunk``."""
    return rate(lambda _: chunk(), chunks, reps) * BULK_CHUNK


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    url = normalize_url(args.url)
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    sqla_queue.install(Session)
    conn = engine.connect()
    raw = psycopg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))

    def driver(table: str) -> Callable[[int], None]:
        sql = f"INSERT INTO {table} (processo, payload) VALUES ('noop', %s) RETURNING id"

        def job(i: int) -> None:
            with raw.transaction():
                raw.execute(sql, (str(i),)).fetchone()

        return job

    def core_plain(i: int) -> None:
        with conn.begin():
            conn.execute(
                Plain.__table__.insert().returning(Plain.__table__.c.id),
                {"processo": "noop", "payload": str(i)},
            ).scalar()

    def orm_plain(i: int) -> None:
        with Session(bind=conn) as s, s.begin():
            s.add(Plain(processo="noop", payload=str(i)))

    def client(i: int) -> None:
        with conn.begin():
            QueueClient(conn, Task).insert_task(None, None, "noop", None, i)

    def orm_task(i: int) -> None:
        with Session(bind=conn) as s, s.begin():
            s.add(Task(process="noop", payload=i))

    def empty_transaction(i: int) -> None:
        with raw.transaction():
            raw.execute("SELECT 1").fetchone()

    jobs = [
        ("psycopg, empty transaction", empty_transaction),
        ("psycopg, plain table", driver(Plain.__tablename__)),
        ("psycopg, queue table", driver(Task.__tablename__)),
        ("SQLAlchemy Core, plain table", core_plain),
        ("SQLAlchemy ORM, plain table", orm_plain),
        ("QueueClient.insert_task", client),
        ("ORM Task (sqla-queue)", orm_task),
    ]
    print("| path | jobs/s | µs per job |\n|---|---|---|")
    try:
        for label, job in jobs:
            jobs_per_s = rate(job, args.n, args.reps)
            print(f"| {label} | {jobs_per_s:,.0f} | {1e6 / jobs_per_s:,.0f} |")
        print()
        bulk(raw, conn, args)
    finally:
        raw.close()
        conn.close()
        Base.metadata.drop_all(engine)
    return 0


def bulk(raw: psycopg.Connection[Any], conn: Connection, args: argparse.Namespace) -> None:
    raw.execute(
        "CREATE UNLOGGED TABLE IF NOT EXISTS bench_floor_copy (id bigint, "
        "processo varchar(250), prioridade int, pub_sub boolean, status varchar(100))"
    )
    raw.commit()
    queue = Task.__tablename__
    next_ids = (
        f"SELECT array_agg(nextval(pg_get_serial_sequence('{queue}', 'id')::regclass)) "
        "FROM generate_series(1, %s)"
    )
    tasks = [{"process": "noop"}] * BULK_CHUNK

    def copy(table: str, prefetch: bool) -> Callable[[], None]:
        def chunk() -> None:
            with raw.transaction():
                ids = raw.execute(next_ids, (BULK_CHUNK,)).fetchone()[0] if prefetch else None
                with (
                    raw.cursor() as cursor,
                    cursor.copy(f"COPY {table} ({_COPY_COLUMNS}) FROM STDIN") as copy,
                ):
                    for i in range(BULK_CHUNK):
                        copy.write_row((ids[i] if ids else i, "noop", 50, False, "pendente"))

        return chunk

    def client(method: str) -> Callable[[], None]:
        def chunk() -> None:
            with conn.begin():
                getattr(QueueClient(conn, Task), method)(tasks)

        return chunk

    def unnest() -> None:
        threshold = PostgresAdapter.COPY_THRESHOLD
        PostgresAdapter.COPY_THRESHOLD = BULK_CHUNK + 1
        try:
            client("insert_tasks")()
        finally:
            PostgresAdapter.COPY_THRESHOLD = threshold

    chunks = max(1, args.n // 100)
    print("| bulk path, 1,000 rows per transaction | rows/s | µs per row |\n|---|---|---|")
    for label, chunk in [
        ("COPY, unlogged table without indexes", copy("bench_floor_copy", prefetch=False)),
        ("COPY, queue table (ids from the sequence first)", copy(queue, prefetch=True)),
        ("QueueClient.copy_tasks", client("copy_tasks")),
        ("QueueClient.insert_tasks (COPY)", client("insert_tasks")),
        ("insert_tasks as INSERT ... SELECT FROM unnest", unnest),
    ]:
        raw.execute(f"TRUNCATE bench_floor_copy, {queue}")
        raw.commit()
        rows_per_s = bulk_rate(chunk, chunks, args.reps)
        print(f"| {label} | {rows_per_s:,.0f} | {1e6 / rows_per_s:,.1f} |")
    raw.execute("DROP TABLE bench_floor_copy")
    raw.commit()


if __name__ == "__main__":
    sys.exit(main())
