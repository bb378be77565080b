"""sqla-queue through ``QueueClient`` (the nsj-queue-lib style SDK call).

Everything but enqueue_one comes from sqla_queue_adapter (same table, same
connections, same workers). enqueue_one:
    with conn.begin(): QueueClient(conn, Task).insert_task(None, None, "noop", None, seq)
on the long-lived SQLAlchemy Connection (psycopg 3); enqueue_bulk: insert_tasks
(the main adapter uses copy_tasks on PostgreSQL). Meant for ``--only a,b``.
"""

from __future__ import annotations

import sqla_queue_adapter as _base
from sqla_queue_adapter import (  # noqa: F401  (the harness's adapter contract)
    BULK_CHUNK,
    LATENCY_SETTING,
    NOTES,
    WORKER_SETTINGS,
    count_done,
    count_jobs,
    preload,
    recover,
    reset,
    setup,
    start_workers,
    stop_workers,
    teardown,
    version,
)

from sqla_queue import QueueClient

PEER = "sqla_queue (QueueClient)"
ENQUEUE_DESC = (
    'with conn.begin(): QueueClient(conn, Task).insert_task(None, None, "noop", '
    "None, seq) (SQLAlchemy Connection, psycopg 3)"
)


def enqueue_bulk(n: int) -> None:
    _base.enqueue_bulk(n, copy=False)  # insert_tasks: COPY on PostgreSQL from 64 rows


def enqueue_one(seq: int | None = None) -> None:
    conn = _base._conn
    assert conn is not None
    with conn.begin():
        QueueClient(conn, _base.Task).insert_task(None, None, "noop", None, seq)
