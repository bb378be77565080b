"""Per-key fairness (sqla_queue/policies/fairness.py, docs/fairness.md) on SQLite,
PostgreSQL and MariaDB: a tenant's backlog does not starve another
tenant's tasks, or the tasks without a tenant; the keys go round."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, inspect, select
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, QueueApp, QueueClient, WorkerBase, payload_key
from sqla_queue.adapters import adapter_of
from sqla_queue.config.settings import Settings
from sqla_queue.worker import Runner
from tests.acceptance.test_concurrency import spawned, worker_env
from tests.conftest import created_engine
from tests.support.app import App, build
from tests.support.limits_app import LIMIT, RATE, most_at_once, spans

BACKLOG = 300


@pytest.fixture
def fapp() -> App:
    return build(f"fila_{uuid.uuid4().hex[:10]}", fair_by=("tenant",))


@pytest.fixture
def fengine(db_url: str, fapp: App) -> Any:
    with created_engine(db_url, fapp.Base.metadata) as engine:
        yield engine


def enqueue(engine: Engine, app: App, tenant: int | None, count: int) -> list[int]:
    with engine.begin() as conn:
        return QueueClient(conn, app.Task).insert_tasks(
            [{"process": "p", "tenant": tenant, "payload": {"n": n}} for n in range(count)]
        )


def run_order(engine: Engine, app: App) -> list[int]:
    """The task ids in the order their handlers ran."""
    with engine.connect() as conn:
        return list(conn.execute(select(app.Effect.task_id).order_by(app.Effect.id)).scalars())


def drain(worker: type[WorkerBase], engine: Engine) -> None:
    assert Runner.for_worker(worker(), engine=engine, burst=True, settings=Settings()).run() == 0


def run_fleet(app: App, db_url: str, probe: Path, worker: str, *, lanes: int) -> None:
    """4 burst processes of ``tests.support.limits_app``'s ``worker``,
    ``lanes`` lanes each, fair by tenant on ``app``'s table; each exits 0."""
    env = worker_env(
        app.Task.__table__.name, SQLA_QUEUE_TEST_PROBE=str(probe), SQLA_QUEUE_TEST_FAIR_BY="tenant"
    )
    args = ("worker", f"tests.support.limits_app:{worker}", "--url", db_url)
    with spawned(*args, "--concurrency", str(lanes), "--burst", env=env, count=4) as workers:
        for process in workers:
            assert process.wait(timeout=90) == 0, process.output


@pytest.mark.parametrize("fair", [True, False])
def test_a_big_backlog_does_not_starve_a_small_tenant(
    fengine: Engine, fapp: App, fair: bool
) -> None:
    big = enqueue(fengine, fapp, 1, BACKLOG)  # older: first in plain claim order
    small = enqueue(fengine, fapp, 2, 10)
    keyless = enqueue(fengine, fapp, None, 5)

    class Worker(fapp.RecordingWorker):  # type: ignore[name-defined,misc]
        batch_size = 10
        fair_by = "tenant" if fair else None

    drain(Worker, fengine)
    order = run_order(fengine, fapp)
    assert sorted(order) == sorted(big + small + keyless)  # each once
    position = {task_id: n for n, task_id in enumerate(order)}
    last_small = max(position[i] for i in small)
    last_keyless = max(position[i] for i in keyless)
    if fair:
        # every claim takes a share of each: the small tenant's ten and the
        # five without a tenant are done within the first few batches
        assert last_small < 60 and last_keyless < 60, (last_small, last_keyless)
        # and within a key, claim order holds
        assert [i for i in order if i in set(small)] == small
    else:  # the control: plain claim order runs the backlog first
        assert min(position[i] for i in small) >= BACKLOG


def test_the_keys_go_round(fengine: Engine, fapp: App) -> None:
    for tenant in (5, 1, 3, 2):
        enqueue(fengine, fapp, tenant, 2)
    enqueue(fengine, fapp, None, 1)
    queries = adapter_of(fengine.dialect, fapp.Task.__table__).fairness("tenant")
    with fengine.connect() as conn:
        assert queries.keys(conn, after=None, limit=2) == [1, 2]
        assert queries.keys(conn, after=2, limit=3) == [3, 5, 1]
        assert queries.keys(conn, after=5, limit=10) == [1, 2, 3, 5]
        assert queries.keys(conn, after=3, limit=10) == [5, 1, 2, 3]
        assert queries.keys(conn, after=9, limit=1) == [1]
        assert queries.unkeyed(conn)


def test_the_fair_index_is_made(fengine: Engine, fapp: App) -> None:
    table = fapp.Task.__table__.name
    names = {index["name"] for index in inspect(fengine).get_indexes(table)}
    wanted = f"ix_{table}_status_justo_tenant" if fengine.dialect.name == "mysql" else None
    assert (wanted or f"ix_{table}_justo_tenant") in names


def test_fair_by_needs_the_models_declaration(app: App, engine: Engine) -> None:
    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        fair_by = "tenant"

    with pytest.raises(ConfigurationError) as error:
        Runner.for_worker(Worker(), engine=engine, settings=Settings())
    table = app.Task.__table__.name
    assert str(error.value) == (
        f"Worker.fair_by = 'tenant': add it to Task.__queue_fair_by__ (the index of a fair "
        f"claim: ix_{table}_justo_tenant) and create it"
    )

    class Typo(app.RecordingWorker):  # type: ignore[name-defined,misc]
        fair_by = "tennant"

    with pytest.raises(ConfigurationError, match=r"Typo\.fair_by must be the name of a column"):
        Runner.for_worker(Typo(), engine=engine, settings=Settings())


def test_a_bad_declaration_is_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="'tennant' is not a column of"):
        build(f"fila_{uuid.uuid4().hex[:10]}", fair_by=("tennant",)).Base.registry.configure()


def test_a_key_never_runs_past_its_limit_across_the_fleet(
    fengine: Engine, fapp: App, db_url: str, tmp_path: Path
) -> None:
    """4 processes of 4 lanes, two tenants of 40 tasks, 40 tasks without a
    tenant (not limited: they keep the lanes busy side by side, so that an
    excess could be seen) and a limit of 2 running tasks per tenant: never
    more than 2 of one tenant at once, more than 2 in all (not on SQLite:
    one batch at a time), each once."""
    for tenant in (1, 2, None):
        enqueue(fengine, fapp, tenant, 40)
    run_fleet(fapp, db_url, tmp_path, "KeyLimitedWorker", lanes=4)
    done = run_order(fengine, fapp)
    assert len(done) == len(set(done)) == 120  # each once
    for tenant in (1, 2):
        assert 1 <= most_at_once(tmp_path, f"tenant-{tenant}") <= LIMIT
    if fengine.dialect.name != "sqlite":
        assert most_at_once(tmp_path, "all") > LIMIT


@pytest.mark.parametrize(
    ("attribute", "value", "message"),
    [
        ("key_concurrency_limit", 2, "must be a whole number of at least 1, not 0"),
        ("key_rate_limit", 5, "key_rate_limit must be a number of tasks per second"),
    ],
)
def test_a_key_limit_needs_fair_by(
    app: App, engine: Engine, attribute: str, value: Any, message: str
) -> None:
    worker = type("Worker", (app.RecordingWorker,), {attribute: value})
    with pytest.raises(ConfigurationError) as error:
        Runner.for_worker(worker(), engine=engine, settings=Settings())
    assert str(error.value) == (
        f"Worker.{attribute} limits the tasks of each key of fair_by: set fair_by"
    )
    zero = type("Zero", (app.RecordingWorker,), {attribute: 0})
    with pytest.raises(ConfigurationError, match=message):
        Runner.for_worker(zero(), engine=engine, settings=Settings())


def test_a_key_is_claimed_no_faster_than_its_rate_across_the_fleet(
    fengine: Engine, fapp: App, db_url: str, tmp_path: Path
) -> None:
    """4 processes of 2 lanes, two tenants of 50 tasks each and 20 without
    a tenant, each tenant limited to 20 tasks a second (a bucket of one
    second's worth): in no second are more than 40 of one tenant claimed
    (the full bucket, then its refill), each tenant's last claim comes at
    least (50 - 20) / 20 = 1.5 s after its first, and every task runs once."""
    for tenant in (1, 2):
        enqueue(fengine, fapp, tenant, 50)
    enqueue(fengine, fapp, None, 20)
    run_fleet(fapp, db_url, tmp_path, "KeyRatedWorker", lanes=2)
    done = run_order(fengine, fapp)
    assert len(done) == len(set(done)) == 120  # each once
    assert len(spans(tmp_path)) == 120
    with fengine.connect() as conn:  # each claim's own time (started_at)
        rows = conn.execute(select(fapp.Task.tenant, fapp.Task.started_at)).all()
    for tenant in (1, 2):
        claimed = sorted(at.timestamp() for key, at in rows if key == tenant)
        assert len(claimed) == 50
        for i, start in enumerate(claimed):
            in_a_second = sum(1 for other in claimed[i:] if other < start + 1.0)
            assert in_a_second <= 2 * RATE, (tenant, in_a_second, claimed)
        assert claimed[-1] - claimed[0] >= (50 - RATE) / RATE - 0.1, (tenant, claimed)


def test_a_key_out_of_tokens_leaves_the_claim_to_the_other_keys(fengine: Engine, fapp: App) -> None:
    """In one process, a rate of one task per 100 s per tenant: the first
    claim takes one task of each tenant (a bucket holds one token at
    least) and the tasks without one; the next claim takes nothing and
    says when the next token comes."""

    class Worker(WorkerBase):
        model = fapp.Task
        fair_by = "tenant"
        key_rate_limit = 0.01

        def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

    enqueue(fengine, fapp, 1, 5)
    enqueue(fengine, fapp, 2, 5)
    enqueue(fengine, fapp, None, 2)
    queue = QueueApp(Worker(), engine=fengine, settings=Settings())
    with queue.adapter.connect_claim(fengine) as conn:
        first = queue.manager.claim(conn, limit=10)
        second = queue.manager.claim(conn, limit=10)
        retry_in = queue.manager.claim_retry_in
    assert sorted((t.tenant is None, t.tenant or 0) for t in first) == [
        (False, 1),
        (False, 2),
        (True, 0),
        (True, 0),
    ]
    assert second == []
    assert retry_in is not None and 50 < retry_in <= 100


@pytest.fixture
def papp() -> App:
    """A queue model whose ``cliente`` column is filled from the payload's
    ``cliente`` key, and listed for fair claims."""
    return build(
        f"fila_{uuid.uuid4().hex[:10]}", fair_by=("cliente",), payload_keys={"cliente": "cliente"}
    )


@pytest.fixture
def pengine(db_url: str, papp: App) -> Any:
    with created_engine(db_url, papp.Base.metadata) as engine:
        yield engine


def test_fair_by_a_payload_key(pengine: Engine, papp: App, installed: None) -> None:
    """Every enqueue path fills the column from the payload key (text; NULL
    without it); a retry carries it; a worker with ``fair_by =
    "payload.cliente"`` does not let one customer's backlog starve another's."""
    task = papp.Task
    with Session(pengine) as session, session.begin():
        session.add_all([task(process="p", payload={"cliente": 1, "fail": "once"})])
        session.add_all([task(process="p", payload={"cliente": 1, "n": n}) for n in range(BACKLOG)])
        session.add(task(process="p", payload={"outro": 1}))  # no key: NULL
        session.add(task(process="p", payload={"cliente": 9}, cliente="dado"))  # given: kept
    with pengine.begin() as conn:
        client = QueueClient(conn, task)
        small = [client.insert_task(processo="p", payload={"cliente": "dois", "n": 0})]
        small += client.insert_tasks(
            [{"processo": "p", "payload": {"cliente": "dois", "n": n}} for n in range(1, 5)]
        )
    with Session(pengine) as session, session.begin():
        session.execute(
            insert(task),
            [{"process": "p", "payload": {"cliente": "dois", "n": n}} for n in range(5, 10)]
            + [{"process": "p", "payload": {"cliente": True}}],
        )
    with pengine.connect() as conn:
        stored = dict(conn.execute(select(task.cliente, func.count()).group_by(task.cliente)).all())
    assert stored == {"1": BACKLOG + 1, None: 1, "dado": 1, "dois": 10, "true": 1}

    class Worker(papp.RecordingWorker):  # type: ignore[name-defined,misc]
        fair_by = "payload.cliente"
        batch_size = 10
        max_retry = 2

    drain(Worker, pengine)
    order = run_order(pengine, papp)
    with pengine.connect() as conn:
        ids_of_two = set(conn.execute(select(task.id).where(task.cliente == "dois")).scalars())
        retried = conn.execute(select(task.cliente).where(task.attempt == 2)).scalars().all()
    assert ids_of_two >= set(small)
    assert {position for position, task_id in enumerate(order) if task_id in ids_of_two} <= set(
        range(60)
    )
    assert retried == ["1"]  # the retry row keeps the key


def test_a_payload_key_is_checked(papp: App, pengine: Engine, installed: None) -> None:
    with pytest.raises(ConfigurationError, match="payload_key\\(\\) takes the name"):
        payload_key("")

    class Unknown(papp.RecordingWorker):  # type: ignore[name-defined,misc]
        fair_by = "payload.nada"

    with pytest.raises(ConfigurationError) as error:
        Runner.for_worker(Unknown(), engine=pengine, settings=Settings())
    assert str(error.value).startswith(
        "Unknown.fair_by = 'payload.nada': no column of "
    ) and "\n" not in str(error.value)
    too_long = papp.Task(process="p", payload={"cliente": "x" * 300})
    with (
        pytest.raises(ValueError, match="payload key 'cliente' holds 300 characters"),
        Session(pengine) as session,
        session.begin(),
    ):
        session.add(too_long)
    with pengine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(papp.Task)).scalar() == 0
