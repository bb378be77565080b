"""Pub/sub fan-out, pub/sub workers and routing by process, on every database.

Real databases (the ``db_url`` fixture), real workers: burst runs in-process,
and the real CLI in a subprocess for the SIGKILL test.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, insert, select
from sqlalchemy.orm import DeclarativeBase, Session

from sqla_queue import (
    ConfigurationError,
    QueueClient,
    QueueMixin,
    SubscriberMixin,
    SubscriptionRecord,
    WorkerBase,
    WorkerPubSubBase,
    dead_subscriber,
    subscriber,
)
from sqla_queue.adapters import ClaimFilter
from sqla_queue.adapters.singlestore import SingleStoreAdapter
from sqla_queue.common.payload import hash_payload
from sqla_queue.config.settings import Settings
from sqla_queue.stages.fanout import CHUNK_ROWS, NO_SUBSCRIBERS_MESSAGE, PUBLISHED_MESSAGE
from sqla_queue.worker import Runner
from tests.acceptance.test_concurrency import spawned
from tests.conftest import wait_until
from tests.integration.test_worker import drain
from tests.support.pubsub_app import PubSubApp, build

SECRET = "s3cr3t-never-copied"


def add_subscribers(engine: Engine, papp: PubSubApp, *rows: dict[str, Any]) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(papp.Subscriber(signing_secret=SECRET, **row) for row in rows)


def publish(engine: Engine, papp: PubSubApp, payload: Any, **columns: Any) -> int:
    columns.setdefault("process", "pedido")
    with engine.begin() as conn:
        return QueueClient(conn, papp.Task).insert_task_pub_sub(payload=payload, **columns)


def rows(engine: Engine, papp: PubSubApp) -> list[Any]:
    with Session(engine) as session:
        return list(session.scalars(select(papp.Task).order_by(papp.Task.id)))


def notes(engine: Engine, papp: PubSubApp) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(papp.Effect.note).order_by(papp.Effect.id)).scalars())


def copies_of(engine: Engine, papp: PubSubApp, publication_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(papp.Task.publication_id == publication_id)
            ).scalar_one()
        )


# ----------------------------------------------------------------- fan-out
def test_publication_yields_one_copy_per_matching_active_subscription(
    pengine: Engine, papp: PubSubApp
) -> None:
    add_subscribers(
        pengine,
        papp,
        {"id": "ok", "process": "pedido", "headers": {"X-A": "1"}},
        {"id": "fails", "process": "pedido", "tenant": 7, "company_group": "G1"},
        {"id": "inactive", "process": "pedido", "active": False},
        {"id": "other-tenant", "process": "pedido", "tenant": 8},
        {"id": "other-process", "process": "nota"},
    )
    payload = {"pedido": 42, "texto": "ação"}
    pub_id = publish(pengine, papp, payload, tenant=7, company_group="G1", priority=70)
    drain(papp.PubSubWorker, pengine)

    tasks = rows(pengine, papp)
    publication = tasks[0]
    assert (publication.id, publication.status, publication.message) == (
        pub_id,
        "sucesso",
        PUBLISHED_MESSAGE,
    )
    # the copies (first attempts; retries and dead letters keep publication_id)
    copies = [
        t for t in tasks if t.publication_id == pub_id and t.initial_id is None and not t.dead
    ]
    assert sorted(c.subscriber_id for c in copies) == ["fails", "ok"]
    for copy in copies:
        assert (copy.pub_sub, copy.attempt, copy.tenant, copy.company_group) == (
            False,
            1,
            7,
            "G1",
        )
        assert (copy.process, copy.priority, copy.dead) == ("pedido", 70, False)
        assert copy.payload_hash == hash_payload(copy.payload_text)
        assert SECRET not in copy.payload_text
        assert "signing_secret" not in copy.payload_text
        # the reference's shape and serialisation
        assert copy.payload_text.isascii() and '", "' in copy.payload_text
        shape = json.loads(copy.payload_text)
        assert list(shape) == ["publication", "subscription"]
        assert shape["publication"] == publication.payload_text
        assert json.loads(shape["publication"]) == payload
        sub = shape["subscription"]
        assert list(sub) == [
            "id",
            "tenant",
            "grupo_empresarial",
            "processo",
            "url",
            "http_method",
            "headers",
            "ativo",
            "created_at",
        ]
        assert sub["id"] == copy.subscriber_id and sub["ativo"] is True
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", sub["created_at"])
    ok = next(c for c in copies if c.subscriber_id == "ok")
    # header values may be tokens: never copied into a queue row
    assert json.loads(ok.payload_text)["subscription"]["headers"] is None
    assert "X-A" not in ok.payload_text
    # each copy ran on its own: 'ok' once, 'fails' retried then dead, its writes rolled back
    assert ok.status == "sucesso" and ok.message == "ok done"
    fails = [t for t in tasks if t.subscriber_id == "fails"]
    assert [(t.status, t.dead) for t in fails] == [
        ("falha", False),
        ("falha", False),
        ("sucesso", True),
    ]
    assert "subscriber 'fails' failed on purpose" in (fails[0].message or "")
    assert fails[2].message == "dead handled"
    assert notes(pengine, papp) == ["ok:42:ok:pedido", "dead:fails"]


def test_publication_without_subscribers_succeeds_with_the_seed_message(
    pengine: Engine, papp: PubSubApp
) -> None:
    pub_id = publish(pengine, papp, {"pedido": 1}, process="ninguem")
    drain(papp.PubSubWorker, pengine)
    [publication] = rows(pengine, papp)
    assert (publication.id, publication.status) == (pub_id, "sucesso")
    assert publication.message == NO_SUBSCRIBERS_MESSAGE


def test_orm_publication_and_webhook_insert_fan_out_too(
    pengine: Engine, papp: PubSubApp, installed: None
) -> None:
    add_subscribers(pengine, papp, {"id": "ok", "process": "pedido"})
    with Session(pengine) as session, session.begin():
        session.add(papp.Task(process="pedido", payload={"pedido": 1}, pub_sub=True))
    with pengine.begin() as conn:
        QueueClient(conn, papp.Task).insert_task_webhook("o", "d", "pedido", "k", {"pedido": 2})
    drain(papp.PubSubWorker, pengine)
    assert sorted(notes(pengine, papp)) == ["ok:1:ok:pedido", "ok:2:ok:pedido"]


def test_plain_worker_fails_a_publication_with_a_clear_message(
    pengine: Engine, papp: PubSubApp
) -> None:
    add_subscribers(pengine, papp, {"id": "ok", "process": "pedido"})
    pub_id = publish(pengine, papp, {"pedido": 1})
    drain(papp.PlainWorker, pengine)
    first = rows(pengine, papp)[0]
    assert (first.id, first.status) == (pub_id, "falha")
    assert "has no subscriber_model" in (first.message or "")
    assert "PlainWorker" in (first.message or "")
    assert copies_of(pengine, papp, pub_id) == 0


def test_exception_between_chunks_rolls_back_earlier_chunks(
    pengine: Engine, papp: PubSubApp
) -> None:
    count = 2 * CHUNK_ROWS + 500
    with pengine.begin() as conn:
        conn.execute(
            insert(papp.Subscriber),
            [{"id": f"s{n:05d}", "processo": "pedido"} for n in range(count)],
        )
    pub_id = publish(pengine, papp, {"pedido": 1})
    worker = Runner.for_worker(papp.PubSubWorker(), engine=pengine, settings=Settings())
    seen: list[int] = []

    def fail_after_two_chunks(inserted: int) -> None:
        seen.append(inserted)
        if inserted >= 2 * CHUNK_ROWS:
            raise RuntimeError("crash between chunks")

    worker.app.fanout.between_chunks = fail_after_two_chunks  # type: ignore[method-assign]
    with worker.adapter.connect_claim(pengine) as claim, pengine.connect() as work:
        tasks = worker.manager.claim(claim, limit=10)
        assert [t.id for t in tasks] == [pub_id]
        result = worker.manager.run_batch(claim, work, tasks, worker.worker.dispatch)
    assert seen == [CHUNK_ROWS, 2 * CHUNK_ROWS]
    assert (result.succeeded, result.failed) == (0, 1)
    assert copies_of(pengine, papp, pub_id) == 0  # the two chunks rolled back
    publication, retry = rows(pengine, papp)
    assert (publication.status, retry.status, retry.initial_id) == ("falha", "pendente", pub_id)

    worker.app.fanout.between_chunks = None  # type: ignore[assignment]
    drain(papp.PubSubWorker, pengine)
    assert copies_of(pengine, papp, pub_id) == 0
    assert copies_of(pengine, papp, retry.id) == count
    with Session(pengine) as session:
        assert session.get(papp.Task, retry.id).message == PUBLISHED_MESSAGE  # type: ignore[union-attr]


def test_sigkill_during_fan_out_leaves_no_partial_fan_out(
    db_url: str, pengine: Engine, papp: PubSubApp, table_name: str, tmp_path: Path
) -> None:
    """A real CLI worker is killed while its fan-out has run two chunk
    statements (the test hook holds it before the third): nothing of it is
    visible; the rescue retries the publication, and the retry fans out whole."""
    count = 2 * CHUNK_ROWS + 500
    with pengine.begin() as conn:
        conn.execute(
            insert(papp.Subscriber),
            [{"id": f"s{n:05d}", "processo": "pedido"} for n in range(count)],
        )
    pub_id = publish(pengine, papp, {"pedido": 1})
    env = {
        "SQLA_QUEUE_TEST_TABLE": table_name,
        "SQLA_QUEUE_TEST_FANOUT_PAUSE": str(tmp_path),
        "SQLA_QUEUE_TEST_LEASE": "1",
    }
    with spawned(
        "worker", "tests.support.pubsub_app:PubSubWorker", "--url", db_url, env=env
    ) as procs:
        wait_until(
            lambda: (tmp_path / "in-fanout").exists() or procs[0].proc.poll() is not None,
            message="the worker to reach its third chunk",
        )
        assert procs[0].proc.poll() is None, procs[0].output
        assert copies_of(pengine, papp, pub_id) == 0  # two chunks written, none committed
        assert rows(pengine, papp)[0].status == "processando"
        procs[0].kill()  # SIGKILL
    rescuer = Runner.for_worker(papp.PubSubWorker(), engine=pengine, settings=Settings())

    def rescue() -> int:
        with rescuer.adapter.connect_maintenance(pengine) as conn:
            return rescuer.manager.rescue(conn)

    wait_until(rescue, message="the rescue to see the killed worker's lost claim")
    drain(papp.PubSubWorker, pengine)
    publication, retry = rows(pengine, papp)[:2]
    assert (publication.id, publication.status) == (pub_id, "falha_processando")
    assert (retry.initial_id, retry.status, retry.message) == (pub_id, "sucesso", PUBLISHED_MESSAGE)
    assert copies_of(pengine, papp, pub_id) == 0
    assert copies_of(pengine, papp, retry.id) == count


# ----------------------------------------------------------- pub/sub workers
def test_copy_for_a_subscriber_without_method_fails_clearly_and_retries(
    pengine: Engine, papp: PubSubApp
) -> None:
    class DeadOnly(papp.PubSubWorker):  # type: ignore[name-defined,misc]
        """Claims 'ghost' copies (it has a dead handler) but no live method."""

        @dead_subscriber("ghost")
        def ghost_dead(self, payload: Any, subscription: Any, task: Any, session: Any) -> str:
            return "ghost dead"

    add_subscribers(pengine, papp, {"id": "ghost", "process": "pedido"})
    pub_id = publish(pengine, papp, {"pedido": 1})
    drain(DeadOnly, pengine)
    ghost = [t for t in rows(pengine, papp) if t.subscriber_id == "ghost"]
    assert ghost[0].publication_id == pub_id
    assert [(t.status, t.dead) for t in ghost] == [
        ("falha", False),
        ("falha", False),
        ("sucesso", True),
    ]
    message = ghost[0].message or ""
    assert "no @subscriber('ghost') method in" in message
    assert "DeadOnly" in message and "Tarefa reenfileirada" in message
    assert ghost[2].message == "ghost dead"


def test_copies_of_unregistered_subscribers_are_left_for_their_worker(
    pengine: Engine, papp: PubSubApp
) -> None:
    add_subscribers(pengine, papp, {"id": "someone-else", "process": "pedido"})
    pub_id = publish(pengine, papp, {"pedido": 1})
    drain(papp.PubSubWorker, pengine)
    publication, copy = rows(pengine, papp)
    assert (publication.id, publication.status) == (pub_id, "sucesso")
    assert (copy.subscriber_id, copy.status) == ("someone-else", "pendente")


def test_dead_copy_without_dead_subscriber_gets_the_default_handler(
    pengine: Engine, papp: PubSubApp
) -> None:
    class NoDead(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber
        max_retry = 1
        retry_interval_minutes = 0

        @subscriber("x")
        def x(self, payload: Any, subscription: Any, task: Any, session: Any) -> None:
            raise ValueError("no")

    add_subscribers(pengine, papp, {"id": "x", "process": "pedido"})
    publish(pengine, papp, {"pedido": 1})
    drain(NoDead, pengine)
    copy, dead = [t for t in rows(pengine, papp) if t.subscriber_id == "x"]
    assert (copy.status, dead.dead, dead.status) == ("falha", True, "sucesso")
    assert dead.message == (
        f"Tarefa com ID {copy.id} excedeu o número de tentativas, sem sucesso. "
        "Será necessária intervenção manual."
    )


def test_two_pubsub_classes_in_one_process_do_not_share_registries() -> None:
    papp = build(f"fila_{uuid.uuid4().hex[:10]}")

    class A(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber

        @subscriber("a")
        def a(self, *args: Any) -> None: ...

    class B(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber

        @subscriber("b")
        @dead_subscriber("b")
        def b(self, *args: Any) -> None: ...

    class C(A):
        @subscriber("a")
        def a2(self, *args: Any) -> None: ...

        @subscriber("c")
        def c(self, *args: Any) -> None: ...

    assert dict(A.subscriber_methods) == {"a": "a"} and dict(A.dead_subscriber_methods) == {}
    assert dict(B.subscriber_methods) == {"b": "b"}
    assert dict(B.dead_subscriber_methods) == {"b": "b"}
    assert dict(C.subscriber_methods) == {"a": "a2", "c": "c"}
    assert dict(WorkerPubSubBase.subscriber_methods) == {}
    assert A.routed_subscriber_ids() == {"a"} and C.routed_subscriber_ids() == {"a", "c"}
    for cls in (A, B, C):
        cls.check_configuration()


def test_pubsub_configuration_errors() -> None:
    papp = build(f"fila_{uuid.uuid4().hex[:10]}")

    class NoSubscriberModel(WorkerPubSubBase):
        model = papp.Task

    with pytest.raises(ConfigurationError, match="subscriber_model must be a mapped"):
        NoSubscriberModel.check_configuration()

    class Mixed(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber

        @subscriber("x")
        async def x(self, *args: Any) -> None: ...

        @subscriber("y")
        def y(self, *args: Any) -> None: ...

    with pytest.raises(
        ConfigurationError, match=r"Mixed\.y is not a coroutine function and other handlers"
    ):
        Mixed.check_configuration()

    class Tenanted(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber
        multi_database = True

        @subscriber("x")
        def x(self, payload: Any, subscription: Any, task: Any, session: Any) -> None: ...

    with pytest.raises(
        ConfigurationError,
        match=r"Tenanted\.x must take \(self, payload, subscription, task, session, "
        r"tenant_session\) in multi-database mode",
    ):
        Tenanted.check_configuration()

    class Both(WorkerPubSubBase):
        model = papp.Task
        subscriber_model = papp.Subscriber
        webhook_subscribers = frozenset({"x"})

        @subscriber("x")
        def x(self, *args: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="'x' has a @subscriber method and is in"):
        Both.check_configuration()

    for attribute, value in (("webhook_subscribers", ["x"]), ("webhook_concurrency", 0)):
        bad = type("Bad", (WorkerPubSubBase,), {"model": papp.Task, attribute: value})
        bad.subscriber_model = papp.Subscriber
        with pytest.raises(ConfigurationError, match=f"Bad\\.{attribute} must be"):
            bad.check_configuration()

    with pytest.raises(ConfigurationError, match="is on both"):

        class Twice(WorkerPubSubBase):
            @subscriber("x")
            def one(self, *args: Any) -> None: ...

            @subscriber("x")
            def two(self, *args: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="subscriber id"):
        subscriber("")

    for bad, match in (
        (["a"], "must be a set"),
        (set(), "is empty"),
        ({"a", 3}, "holds 3"),
    ):

        class Bad(WorkerBase):
            model = papp.Task
            processes = bad  # type: ignore[assignment]

            def execute(self, *args: Any) -> None: ...

        with pytest.raises(ConfigurationError, match=match):
            Bad.check_configuration()


def test_subscription_record_is_a_read_only_mapping_without_the_secret() -> None:
    record = SubscriptionRecord.from_mapping(
        {"id": "s", "processo": "p", "ativo": 1, "signing_secret": SECRET, "tenant": 3}
    )
    assert (record.id, record.process, record.active, record["tenant"]) == ("s", "p", True, 3)
    assert "signing_secret" not in record.as_dict() and SECRET not in repr(record)
    assert list(record) == list(record.as_dict())
    with pytest.raises(AttributeError):
        record.id = "t"  # type: ignore[misc]
    assert issubclass(type(record), object) and SubscriberMixin.__name__ == "SubscriberMixin"


# ---------------------------------------------------------- routing by process
def test_workers_with_disjoint_processes_run_only_their_own_tasks(
    pengine: Engine, papp: PubSubApp, installed: None
) -> None:
    class OnlyA(papp.PlainWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"a"})

    class OnlyBC(papp.PlainWorker):  # type: ignore[name-defined,misc]
        processes = {"b", "c"}  # noqa: RUF012 (a plain set is accepted too)

    with Session(pengine) as session, session.begin():
        session.add_all(
            papp.Task(process=process, payload={"n": n})
            for n in range(5)
            for process in ("a", "b", "c", "d")
        )
    drain(OnlyA, pengine)
    done = {(t.process, t.status) for t in rows(pengine, papp)}
    assert done == {("a", "sucesso"), ("b", "pendente"), ("c", "pendente"), ("d", "pendente")}
    drain(OnlyBC, pengine)
    by_process: dict[str, set[str]] = {}
    for task in rows(pengine, papp):
        by_process.setdefault(task.process, set()).add(task.status)
    assert by_process == {"a": {"sucesso"}, "b": {"sucesso"}, "c": {"sucesso"}, "d": {"pendente"}}
    assert sorted(notes(pengine, papp)) == sorted(
        f"plain:{p}" for p in ("a", "b", "c") for _ in range(5)
    )


def _unrouted_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and "takes every process" in record.getMessage()
    ]


def test_two_workers_that_take_every_process_of_one_table_are_named_at_start(
    pengine: Engine, papp: PubSubApp, caplog: pytest.LogCaptureFixture
) -> None:
    """processes unset: the worker runs any other worker's task. One WARNING
    line at start names the other classes loaded here that do the same."""

    class Faturar(papp.PlainWorker):  # type: ignore[name-defined,misc]
        pass

    class Cobrar(papp.PlainWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"cobrar"})

    table = papp.Task.__table__.name
    with caplog.at_level(logging.INFO, logger="sqla_queue.worker"):
        drain(Cobrar, pengine)
    assert _unrouted_lines(caplog) == []
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sqla_queue.worker"):
        drain(Faturar, pengine)
    [line] = _unrouted_lines(caplog)
    assert re.fullmatch(
        rf"worker Faturar takes every process of \S*{table} \(processes is unset\), "
        r"and so does PlainWorker \(loaded in this process\): "
        r"each runs the others' tasks; set processes on each",
        line,
    ), line


def test_a_worker_alone_on_its_table_that_takes_every_process_says_so_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = "fila_sozinha"

    class Faturar(WorkerBase):
        model = Task

        def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

    engine = create_engine(f"sqlite:///{tmp_path / 'alone.db'}")
    Base.metadata.create_all(engine)
    with caplog.at_level(logging.INFO, logger="sqla_queue.worker"):
        drain(Faturar, engine)
    engine.dispose()
    assert _unrouted_lines(caplog) == [
        "worker Faturar takes every process of fila_sozinha (processes is unset): a task "
        "meant for another worker class runs here; set processes = {...} to claim only its own"
    ]


def test_pubsub_worker_with_processes_claims_only_its_publications(
    pengine: Engine, papp: PubSubApp
) -> None:
    class Pedidos(papp.PubSubWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"pedido"})

    add_subscribers(pengine, papp, {"id": "ok", "process": "pedido"})
    publish(pengine, papp, {"pedido": 1})
    other = publish(pengine, papp, {"pedido": 2}, process="nota")
    with pengine.begin() as conn:
        plain = QueueClient(conn, papp.Task).insert_task(process="pedido", payload={"x": 1})
    drain(Pedidos, pengine)
    status = {t.id: t.status for t in rows(pengine, papp)}
    assert status[other] == "pendente" and status[plain] == "pendente"
    assert notes(pengine, papp) == ["ok:1:ok:pedido"]


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_singlestore_conditional_claim_takes_only_its_processes(
    pengine: Engine, papp: PubSubApp
) -> None:
    """No SingleStore server ran: the SingleStore claim runs on MariaDB."""
    with pengine.begin() as conn:
        client = QueueClient(conn, papp.Task)
        ids = client.insert_tasks({"process": p, "payload": {"p": p}} for p in "abab")
    adapter = SingleStoreAdapter(
        papp.Task.__table__, "x", claim_filter=ClaimFilter(processes=frozenset({"b"}))
    )
    with adapter.connect_claim(pengine) as conn, conn.begin():
        got = adapter.task_claim_many(conn, limit=10, owner="me", lease_seconds=30)
    assert sorted(t.id for t in got) == [ids[1], ids[3]]


@pytest.mark.parametrize(
    "claim_filter",
    [
        ClaimFilter(processes=frozenset({"rare"})),
        ClaimFilter(subscriber_ids=frozenset({"rare"})),
        ClaimFilter(all_subscribers=True, subscriber_ids=frozenset()),
    ],
    ids=["processes", "subscribers", "all-subscribers"],
)
def test_routed_claims_read_an_index(
    pengine: Engine, papp: PubSubApp, claim_filter: ClaimFilter
) -> None:
    """EXPLAIN the claim's statements: no full scan of the table, whatever
    the filter (finished rows of other processes are most of a real table)."""
    from sqla_queue.adapters import adapter_for

    table = papp.Task.__table__
    with pengine.begin() as conn:
        conn.execute(
            insert(table),
            [
                {"processo": "busy", "status": "sucesso", "payload": "{}", "tentativa": 1}
                for _ in range(3000)
            ],
        )
    adapter = adapter_for(pengine.dialect, table, "x", claim_filter=claim_filter)
    dialect = pengine.dialect.name
    with pengine.connect() as conn:
        if dialect == "mysql":
            conn.exec_driver_sql(f"ANALYZE TABLE {table.name}").all()
        elif dialect == "postgresql":
            conn.exec_driver_sql(f"ANALYZE {table.name}")
        else:
            conn.exec_driver_sql("ANALYZE")
        conn.commit()
        seen: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
            if table.name in statement and "pendente" in str(params) + statement:
                seen.append((statement, params))

        event.listen(conn, "before_cursor_execute", capture)
        with conn.begin():
            adapter.task_claim_many(conn, limit=10, owner="explain", lease_seconds=30)
        event.remove(conn, "before_cursor_execute", capture)
        assert seen, "the claim's statements"
        plans = []
        with conn.begin():
            for statement, params in seen:
                explain = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "
                rows_ = conn.exec_driver_sql(explain + statement, params).all()
                plans.append("\n".join(" | ".join(str(v) for v in row) for row in rows_))
            conn.rollback()
    plan = "\n".join(plans)
    assert f"ix_{table.name}_" in plan, plan
    if dialect == "postgresql":
        assert f"Seq Scan on {table.name}" not in plan, plan
    elif dialect == "sqlite":
        assert f"SCAN {table.name}\n" not in plan + "\n", plan
    else:
        assert "| ALL |" not in plan, plan
