"""Where the time of one transactional enqueue goes, on PostgreSQL.

    python benchmarks/enqueue_floor.py [--url URL] [--n 3000] [--reps 3]

Each line is BEGIN, one INSERT, COMMIT on one long-lived connection, n
times, after a warm-up; the median of --reps runs, in jobs/s and in
microseconds per job. From the bare driver up to the ORM path, so the cost
of each layer shows as a difference between two lines:

  psycopg, plain table       the floor: three round trips and a commit
  psycopg, queue table       + the queue table's indexes and NOTIFY trigger
  SQLAlchemy Core, plain     + SQLAlchemy's Connection and compiled-statement cache
  SQLAlchemy ORM, plain      + the ORM unit of work (a 3-column model)
  QueueClient.insert_task    sqla-queue's Core path on the queue table
  ORM Task (sqla-queue)      sqla-queue's ORM path (flush hook, 27 columns)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import psycopg
from sqlalchemy import BigInteger, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sqla_queue
from sqla_queue import QueueClient, QueueMixin
from sqla_queue.settings import normalize_url


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

    jobs = [
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
    finally:
        raw.close()
        conn.close()
        Base.metadata.drop_all(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
