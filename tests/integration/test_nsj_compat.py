"""Two-way compatibility with nsj-queue-lib 1.2.2, the reference, on PostgreSQL.

The reference runs only in its own venv (scripts/install-nsj-reference.sh,
made on demand here too), through tests/support/nsj_driver.py in subprocesses: its
``db_gen``, its ``QueueClient``, its worker (``WorkerBase.run()``, or one
pass of its main loop) and its lock client. Its maintenance threads are
switched off (``QUEUE_MINUTE_*`` never match) so that no test depends on
the minute it runs in.

What is checked: a table made by ``db_gen`` serves sqla-queue after the
documented ALTER (also renamed, with a channel that differs from its name);
``list_equivalent_task`` agrees; a table made by sqla-queue serves the
reference (its client, its worker, tasks enqueued through the ORM hook,
retries either way); pub/sub copies made by either are consumed by the
other; the two libraries' task locks do not exclude each other by default
(shown) and do with ``nsj_locks``; and a mixed fleet of 2 + 2 workers runs
2,000 tasks with no effect twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_queue import JsonText, QueueClient
from sqla_queue.adapters import adapter_for
from sqla_queue.common.exceptions import ConfigurationError
from sqla_queue.config.settings import Settings
from sqla_queue.worker.runner import Runner
from tests.acceptance.test_concurrency import (
    insert_tasks,
    spawned,
    stop_gracefully,
    task_lock_is_free,
    worker_env,
)
from tests.conftest import ROOT, run_cli, server_url, wait_until
from tests.support import nsj_app
from tests.support.app import build as build_app

pytestmark = pytest.mark.postgresql

DRIVER = str(ROOT / "tests" / "support" / "nsj_driver.py")
NEVER = "never"  # a QUEUE_MINUTE_* value that no minute matches


# ------------------------------------------------------------------ the reference
@pytest.fixture(scope="session")
def nsj_python() -> str:
    """The reference venv's python, installed on first use."""
    venv = Path(os.environ.get("SQLA_QUEUE_NSJ_VENV") or ROOT / ".cache" / "nsj-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([str(ROOT / "scripts" / "install-nsj-reference.sh")], timeout=600)
    if not python.exists():
        reason = f"nsj-queue-lib 1.2.2 is not in {venv} (scripts/install-nsj-reference.sh)"
        if os.environ.get("SQLA_QUEUE_REQUIRE_DATABASES"):
            pytest.fail(reason)
        pytest.skip(reason)
    return str(python)


@dataclass
class Reference:
    """nsj-queue-lib on one queue table, driven through subprocesses."""

    python: str
    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(self, *args: str, stdin: Any = None) -> str:
        proc = subprocess.run(
            [self.python, DRIVER, *args],
            env=self.env,
            input="" if stdin is None else json.dumps(stdin),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise AssertionError(f"nsj_driver {' '.join(args)}: {proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def insert(self, *tasks: dict[str, Any]) -> None:
        """QueueClient.insert_task (insert_task_pub_sub with "pub_sub": True), committed."""
        self.run("insert", stdin=list(tasks))

    def equivalent(self, *queries: dict[str, Any]) -> list[Any]:
        return json.loads(self.run("equivalent", stdin=list(queries)))  # type: ignore[no-any-return]

    def drain(self, kind: str = "plain") -> None:
        """One pass of the reference's main loop over the tasks pending now."""
        self.run("drain", kind)

    def spawn(self, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
        log = (self.logs / f"nsj-{len(self.procs)}.log").open("w")
        proc = subprocess.Popen(
            [self.python, DRIVER, *args],
            env=self.env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdin else log,
            stderr=log,
            text=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def output(self) -> str:
        return "\n".join(path.read_text() for path in sorted(self.logs.glob("nsj-*.log")))

    def stop(self) -> None:
        # the reference has no graceful stop (a HALT leaves its threads running)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def reference_env(url: str, table: str, queue_name: str, **extra: str) -> dict[str, str]:
    """The reference's environment (it reads it at import) for one queue."""
    parsed = make_url(url)
    return {
        "PATH": os.environ.get("PATH", ""),
        "DB_HOST": parsed.host or "127.0.0.1",
        "DB_PORT": str(parsed.port or 5432),
        "DB_BASE": parsed.database or "",
        "DB_USER": parsed.username or "",
        # the reference refuses an empty password even where none is needed
        "DB_PASS": parsed.password or "unused",
        "DB_DRIVER": "POSTGRES",
        "QUEUE_NAME": queue_name,
        "QUEUE_TABLE": table,
        "QUEUE_MAX_RETRY": "3",
        "QUEUE_BASE_INTERVAL_RETRY": "0",
        "QUEUE_MINUTE_RETRY_THREAD": NEVER,
        "QUEUE_MINUTE_PURGE_THREAD": NEVER,
        "QUEUE_MINUTE_NOTIFY_THREAD": NEVER,
        "NSJ_TEST_EFFECT_TABLE": f"{table}_effect",
        # the reference writes a subscription's created_at in the session's
        # time zone, sqla-queue in UTC (a documented difference): pin it
        "PGTZ": "UTC",
        **extra,
    }


@pytest.fixture
def pg_url() -> str:
    return str(make_url(server_url("postgresql")).render_as_string(hide_password=False))


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    engine = create_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def schema(engine: Engine) -> Iterator[str]:
    """A schema of the test's own, dropped with everything in it."""
    name = f"nsj_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {name}")
    yield name
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def reference_factory(nsj_python: str, pg_url: str, tmp_path: Path) -> Iterator[Any]:
    made: list[Reference] = []

    def make(table: str, queue_name: str, **extra: str) -> Reference:
        logs = tmp_path / f"reference-{len(made)}"
        logs.mkdir()
        signals = tmp_path / "signals"
        signals.mkdir(exist_ok=True)
        env = reference_env(pg_url, table, queue_name, NSJ_TEST_SIGNAL_DIR=str(signals), **extra)
        made.append(Reference(nsj_python, env, logs))
        return made[-1]

    yield make
    for reference in made:
        reference.stop()


def db_gen(nsj_python: str, schema: str, queue: str) -> str:
    """The reference's DDL for a queue, as ``python -m nsj_queue_lib.db_gen`` prints it."""
    return subprocess.run(
        [nsj_python, "-m", "nsj_queue_lib.db_gen", schema, queue],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def documented_alter(table: str) -> str:
    """The PostgreSQL ALTER of docs/lifecycle.md#leases, for ``table``."""
    doc = (ROOT / "docs" / "lifecycle.md").read_text()
    statement = re.search(r"-- PostgreSQL\n(ALTER TABLE fila [^;]*;)\n", doc)
    assert statement is not None, "docs/lifecycle.md lost its PostgreSQL ALTER"
    return statement.group(1).replace("ALTER TABLE fila ", f"ALTER TABLE {table} ", 1)


def migration_guide_alter(table: str) -> str:
    """Step 2 of docs/coming-from-nsj-queue-lib.md's migration, for ``table``."""
    doc = (ROOT / "docs" / "coming-from-nsj-queue-lib.md").read_text()
    step = doc.split("### 2. ", 1)[1]
    statement = re.search(r"```sql\n(ALTER TABLE filas\.fila_faturamento\b[^;]*;)\n", step)
    assert statement is not None, "the migration guide lost its step 2 ALTER"
    return statement.group(1).replace("filas.fila_faturamento", table, 1)


def made_by_reference(
    engine: Engine, nsj_python: str, schema: str, queue: str, *, lease_columns: bool = True
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(db_gen(nsj_python, schema, queue))
        if lease_columns:
            conn.exec_driver_sql(documented_alter(f"{schema}.{queue}"))


def effects(engine: Engine, app: nsj_app.NsjApp) -> list[tuple[int, int, str]]:
    e = app.Effect
    with engine.connect() as conn:
        rows = conn.execute(select(e.task_id, e.chain_id, e.note).order_by(e.id)).all()
    return [(task_id, chain_id, note) for task_id, chain_id, note in rows]


def rows_of(engine: Engine, app: nsj_app.NsjApp) -> list[Any]:
    with Session(engine, expire_on_commit=False) as session:
        return list(session.scalars(select(app.Task).order_by(app.Task.id)))


def drain(worker: type[Any], engine: Engine, **settings: Any) -> None:
    """A sqla-queue worker in burst mode, in-process."""
    assert worker().run(engine=engine, burst=True, settings=Settings(**settings)) == 0


def listening(engine: Engine, application_name: str, count: int) -> bool:
    """Whether ``count`` reference workers (libpq's PGAPPNAME) ran their LISTEN."""
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = :name AND query ILIKE 'LISTEN %'"
            ),
            {"name": application_name},
        ).scalar_one()
    return found >= count


def sha256_hex(text_: str) -> bytes:
    return hashlib.sha256(text_.encode()).hexdigest().encode()


# ------------------------------------------------------ a table made by db_gen
def test_a_db_gen_table_renamed_apart_from_its_channel_serves_sqla_queue_workers(
    engine: Engine, nsj_python: str, schema: str, reference_factory: Any
) -> None:
    made_by_reference(engine, nsj_python, schema, "fila_ref", lease_columns=False)
    with engine.begin() as conn:
        # renamed after db_gen: the reference's trigger still notifies 'fila_ref'
        conn.exec_driver_sql(f"ALTER TABLE {schema}.fila_ref RENAME TO fila_renomeada")
    app = nsj_app.build("fila_renomeada", schema=schema, channel="fila_ref")
    app.Effect.__table__.create(engine)
    reference = reference_factory(f"{schema}.fila_renomeada", "fila_ref")

    with pytest.raises(ConfigurationError, match=r"lacks sqla-queue's column\(s\) worker_id"):
        drain(app.Worker, engine)
    with engine.begin() as conn:  # step 2 of the migration guide, as written
        conn.exec_driver_sql(migration_guide_alter(f"{schema}.fila_renomeada"))

    # a long fallback poll: only the reference trigger's NOTIFY can wake the worker in time
    runner = Runner.for_worker(
        app.Worker(), engine=engine, settings=Settings(listen_fallback_seconds=300)
    )
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        reference.insert({"origem": "o", "destino": "d", "processo": "p", "chave_externa": "1",
                          "payload": {"primeiro": True}})  # fmt: skip
        wait_until(lambda: len(effects(engine, app)) == 1, message="the first task")
        reference.insert(
            {"origem": "erp", "destino": "sefaz", "processo": "faturar", "chave_externa": "7",
             "payload": {"nota": 7, "cliente": "João"}, "tenant": 47,
             "grupo_empresarial": "G1", "prioridade": 80},
            {"origem": "erp", "destino": "sefaz", "processo": "faturar", "chave_externa": "8",
             "payload": "conteúdo"},
        )  # fmt: skip
        wait_until(lambda: len(effects(engine, app)) == 3, timeout=60, message="the NOTIFY")
    finally:
        runner.stop()
        thread.join(timeout=30)

    first, nota, texto = rows_of(engine, app)
    assert [r.status for r in (first, nota, texto)] == ["sucesso"] * 3
    assert nota.payload == {"nota": 7, "cliente": "João"}
    assert nota.payload_text == '{"nota": 7, "cliente": "Jo\\u00e3o"}'
    assert nota.payload_hash == sha256_hex(nota.payload_text)
    assert (nota.tenant, nota.company_group, nota.priority) == (47, "G1", 80)
    assert (nota.origin, nota.destination, nota.process, nota.external_key) == (
        "erp", "sefaz", "faturar", "7",
    )  # fmt: skip
    assert nota.run_at is not None and nota.run_at.tzinfo is not None
    assert texto.payload == "conteúdo"
    # sha256("conteúdo") as the reference stores it (nsj-reference.md §3)
    assert texto.payload_hash == b"0263637886787eeaa9529fecbc8e63beda6bad2ef5e61c349ff719aad84075b8"
    assert [note for _, _, note in effects(engine, app)] == [
        nsj_app.note_of(1, {"primeiro": True}),
        nsj_app.note_of(1, {"nota": 7, "cliente": "João"}),
        nsj_app.note_of(1, "conteúdo"),
    ]


def test_list_equivalent_task_agrees_between_the_libraries(
    engine: Engine, nsj_python: str, schema: str, reference_factory: Any
) -> None:
    made_by_reference(engine, nsj_python, schema, "fila_eq")
    app = nsj_app.build("fila_eq", schema=schema)
    reference = reference_factory(f"{schema}.fila_eq", "fila_eq")
    keys = {"origem": "erp", "destino": "sefaz", "processo": "faturar"}
    dict_payload = {"nota": 7, "itens": [1, 2], "cliente": "João"}
    json_str = '{"a": 1}'
    # (what nsj-queue-lib code passes, what sqla-queue code passes) for one payload
    cases = {
        "texto": ("conteúdo", "conteúdo"),
        "dict": (dict_payload, dict_payload),
        "json-text": (json_str, JsonText(json_str)),
        "tenant": ("com tenant", "com tenant"),
    }
    scope = {"tenant": {"tenant": 47, "grupo_empresarial": "G1"}}
    reference.insert(
        *({**keys, "chave_externa": key, "payload": ref, **scope.get(key, {})}
          for key, (ref, _) in cases.items())
    )  # fmt: skip
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task)
        ours = {
            key: client.insert_task(**keys, chave_externa=key, payload=mine, **scope.get(key, {}))
            for key, (_, mine) in cases.items()
        }
    with engine.connect() as conn:
        client = QueueClient(conn, app.Task)
        found_by_us = {
            key: sorted(
                row["id"]
                for row in client.list_equivalent_task(
                    **keys, chave_externa=key, payload=mine, **scope.get(key, {})
                )
            )
            for key, (_, mine) in cases.items()
        }
        # a str that is JSON text is a string value for sqla-queue (docs/payload.md)
        as_string = client.list_equivalent_task(**keys, chave_externa="json-text", payload=json_str)
    # the reference hashes only a str: its callers pass the JSON text of a dict
    ref_queries = {key: ref if isinstance(ref, str) else json.dumps(ref)
                   for key, (ref, _) in cases.items()}  # fmt: skip
    answers = reference.equivalent(
        *({**keys, "chave_externa": key, "payload": payload, **scope.get(key, {})}
          for key, payload in ref_queries.items())
    )  # fmt: skip
    found_by_reference = dict(zip(cases, answers, strict=True))
    dict_error = reference.equivalent({**keys, "chave_externa": "dict", "payload": dict_payload})

    for key in cases:
        assert found_by_us[key] == found_by_reference[key], key
        assert len(found_by_us[key]) == 2 and ours[key] in found_by_us[key], key
    assert as_string == []
    assert dict_error == [{"error": "AttributeError: 'dict' object has no attribute 'encode'"}]


# ------------------------------------------------------ a table made by sqla-queue
@pytest.fixture
def our_app(engine: Engine, table_name: str) -> Iterator[nsj_app.NsjApp]:
    """sqla-queue's tables (queue, subscribers, effects), by ``create_all``."""
    app = nsj_app.build(table_name)
    app.Base.metadata.create_all(engine)
    yield app
    app.Base.metadata.drop_all(engine)


def test_the_reference_worker_runs_tasks_of_a_sqla_queue_table_from_both_clients(
    engine: Engine, our_app: nsj_app.NsjApp, table_name: str, reference_factory: Any,
    installed: None,
) -> None:  # fmt: skip
    app = our_app
    appname = f"nsj-{uuid.uuid4().hex[:8]}"
    reference = reference_factory(table_name, table_name, PGAPPNAME=appname)
    reference.spawn("work", "plain")
    wait_until(lambda: listening(engine, appname, 1), message="the reference's LISTEN")

    with Session(engine) as session, session.begin():  # the ORM hook
        session.add_all(
            [
                app.Task(process="orm", external_key="1", payload={"pedido": 7, "nome": "João"}),
                app.Task(process="orm", external_key="2", payload="texto livre", priority=90),
                app.Task(process="orm", external_key="3", payload=[1, "a", None]),
            ]
        )
    reference.insert({"origem": "o", "destino": "d", "processo": "client",
                      "chave_externa": "4", "payload": {"k": "v"}})  # fmt: skip
    wait_until(lambda: len(effects(engine, app)) == 4, message="4 tasks", timeout=60)

    rows = rows_of(engine, app)
    assert {row.status for row in rows} == {"sucesso"}, reference.output()
    assert {row.message for row in rows} == {"nsj ran attempt 1"}
    # the reference's handler gets the stored text, byte for byte
    assert sorted(note for _, _, note in effects(engine, app)) == sorted(
        f"nsj:{row.payload_text}" for row in rows
    )
    assert [row.payload_text for row in rows] == [
        '{"pedido": 7, "nome": "Jo\\u00e3o"}',
        "texto livre",
        '[1, "a", null]',
        '{"k": "v"}',
    ]


def test_retries_made_by_either_library_are_read_and_run_by_the_other(
    engine: Engine, our_app: nsj_app.NsjApp, table_name: str, reference_factory: Any,
    installed: None,
) -> None:  # fmt: skip
    app = our_app
    reference = reference_factory(table_name, table_name)
    # 1. enqueued by the ORM hook, failed by the reference, retried by sqla-queue
    with Session(engine) as session, session.begin():
        first = app.Task(process="p", external_key="1", payload={"fail": 1, "k": "v"})
        session.add(first)
    reference.drain()
    drain(app.Worker, engine)

    # 2. enqueued by the reference's client, failed by sqla-queue, retried by the reference
    reference.insert({"origem": "o", "destino": "d", "processo": "p", "chave_externa": "2",
                      "payload": {"fail": 1, "k": "w"}})  # fmt: skip

    class RetryLater(app.Worker):  # type: ignore[name-defined,misc]
        retry_interval_minutes = 0.005  # 0.3 s: the burst ends before the retry is due

    drain(RetryLater, engine)
    adapter = adapter_for(engine.dialect, app.Task.__table__, table_name)

    def promoted() -> int:  # as a sqla-queue worker promotes due retries
        with engine.begin() as conn:
            return adapter.task_promote_due(conn)

    wait_until(promoted, message="the retry to fall due")
    reference.drain()

    rows = rows_of(engine, app)
    first, retry1, second, retry2 = rows
    assert [(r.status, r.attempt) for r in rows] == [
        ("falha", 1), ("sucesso", 2), ("falha", 1), ("sucesso", 2),
    ]  # fmt: skip
    for failed, retry in ((first, retry1), (second, retry2)):
        # the same layout from either library: the payload stays on the first attempt
        assert retry.payload_text is None and retry.payload_hash == failed.payload_hash
        assert (retry.initial_id, retry.previous_id) == (failed.id, failed.id)
        assert failed.requeued and failed.message.endswith(". Tarefa reenfileirada.")
    assert first.message == "asked to fail attempt 1. Tarefa reenfileirada."  # the reference's
    assert second.message == "RuntimeError: asked to fail attempt 1. Tarefa reenfileirada."
    assert effects(engine, app) == [
        (retry1.id, first.id, nsj_app.note_of(2, {"fail": 1, "k": "v"})),
        (retry2.id, second.id, f"nsj:{second.payload_text}"),
    ]


@pytest.mark.parametrize("made_by", ["sqla-queue", "db_gen"])
def test_pub_sub_copies_made_by_either_library_are_consumed_by_the_other(
    engine: Engine, nsj_python: str, schema: str, reference_factory: Any, made_by: str
) -> None:
    app = nsj_app.build("fila_pubsub", schema=schema)
    if made_by == "db_gen":  # its subscriber table has no signing_secret: none is needed
        made_by_reference(engine, nsj_python, schema, "fila_pubsub")
        app.Effect.__table__.create(engine)
    else:
        app.Base.metadata.create_all(engine)
    table_name = f"{schema}.fila_pubsub"
    reference = reference_factory(
        table_name, "fila_pubsub", QUEUE_SUBSCRIBER_TABLE=f"{table_name}_subscriber"
    )
    with engine.begin() as conn:
        conn.execute(
            insert(app.Subscriber.__table__),
            [
                {"id": "sqla-sub", "processo": "pedido", "tenant": None, "headers": None},
                {"id": "nsj-sub", "processo": "pedido", "tenant": 7, "headers": {"X-A": "1"}},
                {"id": "other", "processo": "outro", "tenant": None, "headers": None},
            ],
        )
    publication = {"origem": "loja", "destino": "erp", "processo": "pedido", "tenant": 7}
    # fanned out by sqla-queue, which runs its own subscription's copy
    with engine.begin() as conn:
        ours = QueueClient(conn, app.Task).insert_task_pub_sub(
            **publication, chave_externa="2", payload={"pedido": 2}
        )
    drain(app.PubSubWorker, engine)
    # fanned out by the reference, whose pass also runs the copy above left for it
    reference.insert({**publication, "chave_externa": "1", "payload": {"pedido": 1},
                      "pub_sub": True})  # fmt: skip
    reference.drain("pubsub")
    drain(app.PubSubWorker, engine)
    reference.drain("pubsub")

    rows = {row.id: row for row in rows_of(engine, app)}
    pubs = {row.external_key: row for row in rows.values() if row.pub_sub}
    copies = [row for row in rows.values() if row.publication_id is not None]
    assert {row.status for row in rows.values()} == {"sucesso"}
    assert {row.message for row in pubs.values()} == {"Publicado para os assinantes, com sucesso!"}
    assert pubs["2"].id == ours
    assert sorted((rows[c.publication_id].external_key, c.subscriber_id) for c in copies) == [
        ("1", "nsj-sub"), ("1", "sqla-sub"), ("2", "nsj-sub"), ("2", "sqla-sub"),
    ]  # fmt: skip
    # the same copy payload from either library
    by_copy = {(rows[c.publication_id].external_key, c.subscriber_id): c for c in copies}
    for subscription in ("nsj-sub", "sqla-sub"):
        their_copy, our_copy = by_copy["1", subscription], by_copy["2", subscription]
        theirs, mine = their_copy.payload, our_copy.payload
        # the same, but for the header values we never copy into a queue row
        assert mine["subscription"]["headers"] is None
        assert {**theirs["subscription"], "headers": None} == mine["subscription"], subscription
        assert (theirs["publication"], mine["publication"]) == ('{"pedido": 1}', '{"pedido": 2}')
        assert their_copy.payload_hash == sha256_hex(their_copy.payload_text)
    assert by_copy["1", "nsj-sub"].payload["subscription"]["headers"] == {"X-A": "1"}
    assert by_copy["2", "nsj-sub"].payload["subscription"]["headers"] is None
    notes = sorted(note for _, _, note in effects(engine, app))
    assert notes == [
        'nsj-sub:nsj-sub:pedido:{"pedido": 1}',
        'nsj-sub:nsj-sub:pedido:{"pedido": 2}',
        'sqla-sub:sqla-sub:pedido:{"pedido": 1}',
        'sqla-sub:sqla-sub:pedido:{"pedido": 2}',
    ]


# ------------------------------------------------------ the two libraries' locks
@pytest.mark.parametrize("nsj_locks", [False, True], ids=["default", "nsj_locks"])
def test_a_rescue_takes_a_running_reference_task_for_lost_unless_nsj_locks(
    engine: Engine, our_app: nsj_app.NsjApp, table_name: str, reference_factory: Any,
    nsj_locks: bool,
) -> None:  # fmt: skip
    app = our_app
    reference = reference_factory(table_name, table_name)
    signals = Path(reference.env["NSJ_TEST_SIGNAL_DIR"])
    with engine.begin() as conn:
        task_id = QueueClient(conn, app.Task).insert_task("o", "d", "p", "1", {"block": True})
    running = reference.spawn("drain", "plain")
    wait_until(lambda: (signals / f"started-{task_id}").exists(), message="the reference's run")

    drain(app.Worker, engine, nsj_locks=nsj_locks)  # its rescue runs at start-up
    (signals / "go").touch()
    assert running.wait(timeout=60) == 0, reference.output()

    notes = sorted(note for _, _, note in effects(engine, app))
    if nsj_locks:
        assert notes == ['nsj:{"block": true}']
        assert [row.status for row in rows_of(engine, app)] == ["sucesso"]
    else:
        # the reference's task had no sqla-queue lock and no lease: "lost", so
        # re-enqueued and run by sqla-queue while the reference ran it too
        assert notes == ['nsj:{"block": true}', nsj_app.note_of(2, {"block": True})]


def test_with_nsj_locks_a_dead_reference_worker_s_task_is_rescued_under_its_key(
    engine: Engine, our_app: nsj_app.NsjApp, table_name: str, reference_factory: Any
) -> None:
    app = our_app
    reference = reference_factory(table_name, table_name)
    signals = Path(reference.env["NSJ_TEST_SIGNAL_DIR"])
    with engine.begin() as conn:
        task_id = QueueClient(conn, app.Task).insert_task("o", "d", "p", "1", {"block": True})
    running = reference.spawn("drain", "plain")
    wait_until(lambda: (signals / f"started-{task_id}").exists(), message="the reference's run")
    running.kill()  # the worker dies mid-task: its key goes with its session
    running.wait(timeout=10)
    wait_until(lambda: nsj_lock_holders(engine, task_id) == 0, message="the dead session's key")

    table = app.Task.__table__
    adapter = adapter_for(engine.dialect, table, table.name, nsj_locks=True)
    with engine.connect() as conn, conn.begin():
        assert [task.id for task in adapter.task_rescue_lost(conn, limit=10)] == [task_id]
        # until the rescue commits, the reference's retry thread cannot take the task
        assert reference.run("lock", str(task_id)).strip() == "false"
        conn.rollback()
    assert reference.run("lock", str(task_id)).strip() == "true"

    drain(app.Worker, engine, nsj_locks=True)
    first, retry = rows_of(engine, app)
    assert (first.status, retry.status) == ("falha_processando", "sucesso")
    assert effects(engine, app) == [(retry.id, task_id, nsj_app.note_of(2, {"block": True}))]


def nsj_lock_holders(engine: Engine, task_id: int) -> int:
    """Sessions holding the reference's single-key lock on ``task_id``."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND classid = CAST(:high AS oid) AND objid = CAST(:low AS oid)"
            ),
            {"high": task_id >> 32, "low": task_id & 0xFFFFFFFF},
        ).scalar_one()


@pytest.mark.parametrize("nsj_locks", [False, True], ids=["default", "nsj_locks"])
def test_a_claim_ignores_the_reference_lock_unless_nsj_locks(
    engine: Engine, our_app: nsj_app.NsjApp, table_name: str, reference_factory: Any,
    nsj_locks: bool,
) -> None:  # fmt: skip
    app = our_app
    reference = reference_factory(table_name, table_name)
    with engine.begin() as conn:
        task_id = QueueClient(conn, app.Task).insert_task("o", "d", "p", "1", {"n": 1})
    # the reference's worker between its lock and its re-read of the row
    holder = reference.spawn("lock", str(task_id), stdin=True)
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "true", reference.output()

    drain(app.Worker, engine, nsj_locks=nsj_locks)
    (row,) = rows_of(engine, app)
    if nsj_locks:
        # claimed, refused by the lock, handed back untouched
        assert (row.status, row.worker_id, row.lease_expires_at) == ("pendente", None, None)
        assert effects(engine, app) == []
    else:
        # run while the reference held its lock: the reference, finding the
        # row still 'pendente' a moment earlier, would run it as well
        assert row.status == "sucesso" and len(effects(engine, app)) == 1

    holder.stdin.close()
    assert holder.wait(timeout=30) == 0
    drain(app.Worker, engine, nsj_locks=nsj_locks)
    assert [row.status for row in rows_of(engine, app)] == ["sucesso"]
    assert len(effects(engine, app)) == 1
    # both keys released after the commit, none left on a pooled connection
    assert nsj_lock_holders(engine, task_id) == 0
    assert task_lock_is_free(engine, app, task_id)  # type: ignore[arg-type]


def test_nsj_locks_is_refused_where_it_cannot_work(tmp_path: Path) -> None:
    sqlite = create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    app = nsj_app.build("fila")
    with pytest.raises(ConfigurationError, match=r"\(SQLA_QUEUE_NSJ_LOCKS\) is for PostgreSQL"):
        Runner.for_worker(app.Worker(), engine=sqlite, settings=Settings(nsj_locks=True))
    pg = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(ConfigurationError, match=r"\(SQLA_QUEUE_NSJ_LOCKS\) needs task locks"):
        Runner.for_worker(
            app.Worker(), engine=pg, settings=Settings(nsj_locks=True, task_locks=False)
        )
    # the command: one line, no traceback
    proc = run_cli(
        "worker", "tests.support.app:RecordingWorker", "--url", f"sqlite:///{tmp_path / 'cli.db'}",
        env={"SQLA_QUEUE_NSJ_LOCKS": "true"}, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "Error: nsj_locks (SQLA_QUEUE_NSJ_LOCKS) is for PostgreSQL, not sqlite: "
        "nsj-queue-lib's workers lock tasks with pg_try_advisory_lock there only"
    ]
    with pytest.raises(ConfigurationError, match="SQLA_QUEUE_NSJ_LOCKS must be true or false"):
        Settings.from_env({"SQLA_QUEUE_NSJ_LOCKS": "maybe"})
    assert Settings.from_env({"SQLA_QUEUE_NSJ_LOCKS": "true"}).nsj_locks

    class Bad(app.Worker):  # type: ignore[name-defined,misc]
        nsj_locks = "yes"

    with pytest.raises(ConfigurationError, match=r"Bad.nsj_locks must be True or False or None"):
        Bad.check_configuration()
    sqlite.dispose()
    pg.dispose()


# ------------------------------------------------------ a mixed fleet
FLEET_TASKS = 2000


@pytest.fixture
def reference_table(engine: Engine, nsj_python: str, table_name: str) -> Iterator[str]:
    """A queue table made by db_gen in ``public``, with the documented ALTER."""
    made_by_reference(engine, nsj_python, "public", table_name)
    yield table_name
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"DROP TABLE IF EXISTS {table_name}, {table_name}_subscriber, {table_name}_effect"
        )
        conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS notify_{table_name}_insert()")


def test_a_mixed_fleet_of_two_reference_and_two_sqla_queue_workers_runs_each_task_once(
    engine: Engine, pg_url: str, reference_table: str, reference_factory: Any
) -> None:
    table_name = reference_table  # the migration's starting point
    app = build_app(table_name)  # tests.support.app: its RecordingWorker runs in the CLI workers
    app.Effect.__table__.create(engine)
    appname = f"nsj-{uuid.uuid4().hex[:8]}"
    reference = reference_factory(table_name, table_name, PGAPPNAME=appname)
    for _ in range(2):
        reference.spawn("work", "plain")
    env = worker_env(table_name, SQLA_QUEUE_NSJ_LOCKS="true")
    args = (
        "worker",
        "tests.support.app:RecordingWorker",
        "--url",
        pg_url,
        "--log-level",
        "WARNING",
    )
    with spawned(*args, env=env, count=2) as workers:
        wait_until(lambda: listening(engine, appname, 2), message="the reference's LISTENs")
        # both clients at once, in four transactions each, while all four workers run
        half = FLEET_TASKS // 2
        inserting = reference.spawn("insert", str(half // 4), stdin=True)
        assert inserting.stdin is not None
        json.dump(
            [{"origem": "o", "destino": "d", "processo": "bulk", "chave_externa": str(n),
              "payload": {"n": n}} for n in range(half)],
            inserting.stdin,
        )  # fmt: skip
        inserting.stdin.close()
        for _ in range(4):
            insert_tasks(engine, app, half // 4)  # type: ignore[arg-type]
        assert inserting.wait(timeout=60) == 0, reference.output()

        def finished() -> bool:
            with engine.connect() as conn:
                done = select(func.count()).where(app.Task.status == "sucesso")
                return conn.execute(done).scalar_one() == FLEET_TASKS

        wait_until(finished, timeout=60, interval=0.2, message=f"{FLEET_TASKS} tasks to finish")
        stop_gracefully(workers)

    e = app.Effect.__table__.c
    with engine.connect() as conn:
        # by chain: a task re-run through a retry row counts as run twice too
        runs = conn.execute(select(e.chain_id, func.count(), func.min(e.note)).group_by(e.chain_id))
        runs = runs.all()
        rows = conn.execute(select(func.count()).select_from(app.Task)).scalar_one()
    by_reference = sum(1 for _, _, note in runs if note.startswith("nsj:"))
    print(f"mixed fleet: {by_reference} of {FLEET_TASKS} tasks run by the reference")
    assert [chain_id for chain_id, count, _ in runs if count > 1] == []  # 0 duplicated effects
    assert len(runs) == rows == FLEET_TASKS  # every task ran, none was retried
    assert 0 < by_reference < FLEET_TASKS, reference.output()  # both fleets took part
