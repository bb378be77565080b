"""Drives nsj-queue-lib 1.2.2, the reference, for tests/integration/test_nsj_compat.py.

Runs in the reference's own venv (scripts/install-nsj-reference.sh), never
in ours: it imports nothing of sqla-queue or of the tests. The reference
reads its configuration from the environment at import (DB_HOST, DB_PORT,
DB_BASE, DB_USER, DB_PASS, DB_DRIVER, QUEUE_NAME, QUEUE_TABLE,
QUEUE_SUBSCRIBER_TABLE, ...), so the test sets those; this script adds
NSJ_TEST_EFFECT_TABLE (where handlers write one row per run) and
NSJ_TEST_SIGNAL_DIR (files that block a handler).

    nsj_driver.py insert [N]   stdin: JSON list of insert_task keyword sets
                               ("pub_sub": true for insert_task_pub_sub); one
                               transaction, or one per N tasks, committed
    nsj_driver.py equivalent   stdin: JSON list of list_equivalent_task
                               keyword sets; stdout: per query, the ids found
                               (sorted) or {"error": "<type>: <text>"}
    nsj_driver.py work KIND    the reference's worker, WorkerBase.run(): runs
                               until killed (KIND: plain or pubsub)
    nsj_driver.py drain KIND   one pass of the reference's main loop
                               (MainThread._run_tarefas: every task pending
                               when it starts, each through the reference's
                               lock, re-read, run, retry), then exit
    nsj_driver.py lock ID      take the reference's task lock on ID
                               (LockClient.try_lock), print true/false, hold
                               it until stdin closes

A plain handler's task payload may ask for behaviour (a JSON object):
``{"fail": n}`` raises on attempts 1..n, ``{"block": true}`` touches
``started-<id>`` in NSJ_TEST_SIGNAL_DIR and waits for ``go`` there.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any

EFFECT_NOTE_LENGTH = 200  # the tests' effect table: note varchar(200)


def _connect() -> Any:
    from nsj_queue_lib import settings
    from nsj_sql_utils_lib.dbconnection import DBConnection

    conn = DBConnection(
        settings.DB_DRIVER,
        settings.DB_HOST,
        settings.DB_PORT,
        settings.DB_BASE,
        settings.DB_USER,
        settings.DB_PASS,
    )
    conn.open()
    return conn


def _client(conn: Any) -> Any:
    from nsj_queue_lib import settings
    from nsj_queue_lib.queue_client import QueueClient

    return QueueClient(conn, settings.QUEUE_TABLE, settings.QUEUE_SUBSCRIBER_TABLE)


def _record(bd_conn: Any, tarefa: dict[str, Any], note: str) -> None:
    """One effect row, in the transaction that records the task's 'sucesso'."""
    table = os.environ["NSJ_TEST_EFFECT_TABLE"]
    with bd_conn.conn.cursor() as cursor:
        cursor.execute(
            f"insert into {table} (task_id, chain_id, note) values (%s, %s, %s)",
            (tarefa["id"], tarefa["id_inicial"] or tarefa["id"], note[:EFFECT_NOTE_LENGTH]),
        )


def _wait_for_go(task_id: int) -> None:
    directory = pathlib.Path(os.environ["NSJ_TEST_SIGNAL_DIR"])
    (directory / f"started-{task_id}").touch()
    deadline = time.monotonic() + 60
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go file within 60 s")
        time.sleep(0.01)  # the blocked handler's own work, not a test wait


def _worker(kind: str) -> Any:
    from nsj_queue_lib.worker_base import WorkerBase
    from nsj_queue_lib.worker_pub_sub_base import DeadSubscriber, Subscriber, WorkerPubSubBase

    class PlainWorker(WorkerBase):
        def execute(
            self, payload: Any, tarefa: Any, bd_conn: Any, multi_db_conn: Any = None
        ) -> str:
            try:
                asked = json.loads(payload) if payload else None
            except ValueError:
                asked = None
            if isinstance(asked, dict):
                if asked.get("block"):
                    _wait_for_go(tarefa["id"])
                if tarefa["tentativa"] <= int(asked.get("fail", 0)):
                    raise RuntimeError(f"asked to fail attempt {tarefa['tentativa']}")
            _record(bd_conn, tarefa, f"nsj:{payload}")
            return f"nsj ran attempt {tarefa['tentativa']}"

        def execute_dead(
            self, payload: Any, tarefa: Any, bd_conn: Any, multi_db_conn: Any = None
        ) -> str:
            _record(bd_conn, tarefa, f"nsj-dead:{payload}")
            return "nsj dead handled"

    class PubSubWorker(WorkerPubSubBase):
        pass

    @Subscriber("nsj-sub")
    def on_copy(self: Any, payload: Any, subscription: Any, tarefa: Any, bd_conn: Any) -> str:
        # payload: the copy's whole payload, decoded; its "publication" is text
        note = f"nsj-sub:{subscription['id']}:{subscription['processo']}:{payload['publication']}"
        _record(bd_conn, tarefa, note)
        return "nsj subscriber ran"

    @DeadSubscriber("nsj-sub")
    def on_dead_copy(self: Any, payload: Any, subscription: Any, tarefa: Any, bd_conn: Any) -> str:
        _record(bd_conn, tarefa, f"nsj-sub-dead:{subscription['id']}")
        return "nsj dead subscriber ran"

    return {"plain": PlainWorker, "pubsub": PubSubWorker}[kind]()


def insert(per_transaction: int | None) -> None:
    tasks = json.load(sys.stdin)
    conn = _connect()
    raw = conn.conn
    raw.autocommit = False
    try:
        client = _client(raw)
        for done, task in enumerate(tasks, 1):
            pub_sub = task.pop("pub_sub", False)
            (client.insert_task_pub_sub if pub_sub else client.insert_task)(**task)
            if per_transaction and done % per_transaction == 0:
                raw.commit()
        raw.commit()
    finally:
        conn.close()


def equivalent() -> None:
    queries = json.load(sys.stdin)
    conn = _connect()
    try:
        client = _client(conn.conn)
        answers: list[Any] = []
        for query in queries:
            try:
                answers.append(sorted(row["id"] for row in client.list_equivalent_task(**query)))
            except Exception as exc:  # the reference's own failures are results here
                answers.append({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()
    json.dump(answers, sys.stdout)


def drain(kind: str) -> None:
    from nsj_queue_lib.client.main_thread import MainThread

    conn = _connect()
    try:
        MainThread(_worker(kind))._run_tarefas(conn.conn)
    finally:
        conn.close()


def lock(task_id: int) -> None:
    from nsj_queue_lib.client.lock_client import LockClient
    from nsj_sql_utils_lib.dbadapter3 import DBAdapter3

    conn = _connect()
    try:
        print(json.dumps(LockClient(DBAdapter3(conn.conn), None).try_lock(task_id)), flush=True)
        sys.stdin.read()  # held until the test closes our stdin
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "insert":
        insert(int(args[0]) if args else None)
    elif command == "equivalent":
        equivalent()
    elif command == "work":
        _worker(args[0]).run()
    elif command == "drain":
        drain(args[0])
    elif command == "lock":
        lock(int(args[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
