"""Claims under faults: leases, the guarded completion, the rescue, promotion.

Each test reproduces a defect found when the core was tried from outside
(a task's effects committed twice, a lost task hidden from the rescue, a lane
stalled by an application's row lock, GET_LOCK names shared between
databases, transaction state leaking from task to task, user columns dropped
from retries) and checks the fix, in-process and step by step: two
``Runner`` objects are two workers with their own ids.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    String,
    create_engine,
    event,
    func,
    select,
    text,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import QueueMixin, WorkerBase
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.policies.leases import Heartbeat
from sqla_queue.worker import Runner
from tests.conftest import wait_until
from tests.integration.test_worker import EXHAUSTED_SUFFIX, RESCUED, drain, effects, enqueue, tasks
from tests.support.app import App, build
from tests.support.servers import PrivatePostgres

RESCUED_LAST = (
    "Falha desconhecida de processamento (processamento abortado repentinamente)" + EXHAUSTED_SUFFIX
)
servers = pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)


def runner(worker: type[WorkerBase], engine: Engine) -> Runner:
    """A worker's runner, not started: its manager claims, runs and rescues."""
    return Runner.for_worker(worker(), engine=engine, settings=Settings())


def expire_lease(engine: Engine, app: App, task_id: int) -> None:
    """The lease ran out (its heartbeat stopped, as when the process hangs)."""
    with engine.begin() as conn:
        conn.execute(
            update(app.Task)
            .where(app.Task.id == task_id)
            .values(lease_expires_at=utcnow() - dt.timedelta(hours=1))
        )


def rescue(worker: Runner) -> int:
    with worker.adapter.connect_maintenance(worker.engine) as conn:
        return worker.manager.rescue(conn)


def promote_due(worker: Runner, conn: Connection) -> int:
    """The schedule routine's promotion of due tasks, in a transaction of its own."""
    with conn.begin():
        return worker.adapter.task_promote_due(conn)


def backend_id(conn: Any) -> int:
    with conn.begin():
        if conn.dialect.name == "postgresql":
            return int(conn.execute(select(func.pg_backend_pid())).scalar_one())
        return int(conn.execute(text("SELECT CONNECTION_ID()")).scalar_one())


def kill_backend(engine: Engine, pid: int) -> None:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        else:
            conn.execute(text(f"KILL {int(pid)}"))


# --------------------------------------------------------------- the guarded completion
def test_task_rescued_before_its_batch_commits_rolls_its_work_back(
    engine: Engine, app: App, installed: None
) -> None:
    [task_id] = enqueue(engine, app, {"n": 1})
    slow, rescuer = runner(app.RecordingWorker, engine), runner(app.RecordingWorker, engine)
    with slow.adapter.connect_claim(engine) as claim, engine.connect() as work:
        running = slow.manager.claim(claim, limit=1)
        expire_lease(engine, app, task_id)
        assert rescue(rescuer) == 1
        result = slow.manager.run_batch(claim, work, running, slow.worker.dispatch)
    assert (result.succeeded, result.failed) == (0, 0)
    assert effects(engine, app) == []  # the late run's work rolled back

    drain(app.RecordingWorker, engine)
    lost, retry = tasks(engine, app)
    assert (lost.id, lost.status, lost.message) == (task_id, "falha_processando", RESCUED)
    assert (retry.initial_id, retry.status) == (task_id, "sucesso")
    assert effects(engine, app) == [(retry.id, task_id, "{'n': 1}")]


@servers
def test_claim_connection_killed_under_a_handler_commits_the_effect_once(
    engine: Engine, app: App, installed: None
) -> None:
    """The per-task lock died with the claim connection (a network blip, an
    idle timeout, a DBA's kill) while the handler ran on the work connection:
    another worker's rescue re-enqueued the task, so the first run must not
    commit its work and 'sucesso' as well."""
    [task_id] = enqueue(engine, app, {"n": 1})
    rescuer = runner(app.RecordingWorker, engine)
    rescued: list[int] = []

    class Victim(app.RecordingWorker):  # type: ignore[name-defined,misc]
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            kill_backend(engine, claim_pid)
            wait_until(lambda: rescue(rescuer), message="the rescue to see the lost lock")
            rescued.append(task.id)
            return super().execute(payload, task, session)

    victim = runner(Victim, engine)
    with victim.adapter.connect_claim(engine) as claim, engine.connect() as work:
        claim_pid = backend_id(claim)
        running = victim.manager.claim(claim, limit=1)
        result = victim.manager.run_batch(claim, work, running, victim.worker.dispatch)
    assert rescued == [task_id]
    assert result.succeeded == 0
    assert effects(engine, app) == []

    drain(app.RecordingWorker, engine)
    assert [t.status for t in tasks(engine, app)] == ["falha_processando", "sucesso"]
    assert len(effects(engine, app)) == 1


@servers
def test_heartbeat_keeps_a_task_longer_than_its_lease_from_the_rescue(
    engine: Engine, app: App, installed: None
) -> None:
    [task_id] = enqueue(engine, app, {"n": 1})
    rescuer = runner(app.RecordingWorker, engine)
    rescues: list[int] = []

    # the lease is the slack between a beat and the rescue that follows it
    # (a loaded machine can stall the test thread for a second)
    class Long(app.RecordingWorker):  # type: ignore[name-defined,misc]
        lease_seconds = 2.0

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            started = utcnow()
            while utcnow() - started < dt.timedelta(seconds=3.5):  # 1.75 leases of work
                heartbeat.beat.clear()
                assert heartbeat.beat.wait(timeout=5), "no heartbeat"
                rescues.append(rescue(rescuer))
            return super().execute(payload, task, session)

    long = runner(Long, engine)
    heartbeat = Heartbeat(engine, long.adapter, long.app.claims, long.app.lease)
    heartbeat.start()
    try:
        with long.adapter.connect_claim(engine) as claim, engine.connect() as work:
            running = long.manager.claim(claim, limit=1)
            result = long.manager.run_batch(claim, work, running, long.worker.dispatch)
    finally:
        heartbeat.stop()
    assert len(rescues) >= 4 and set(rescues) == {0}
    assert result.succeeded == 1
    assert [(t.id, t.status) for t in tasks(engine, app)] == [(task_id, "sucesso")]
    assert len(effects(engine, app)) == 1


def test_rescue_of_the_last_attempt_says_so_once(engine: Engine, app: App, installed: None) -> None:
    class OneAttempt(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    [task_id] = enqueue(engine, app, {"n": 1})
    lost = runner(OneAttempt, engine)
    with lost.adapter.connect_claim(engine) as claim:
        lost.manager.claim(claim, limit=1)
    expire_lease(engine, app, task_id)
    assert rescue(runner(OneAttempt, engine)) == 1
    first, dead = tasks(engine, app)
    assert (first.status, first.retries_exhausted, first.message) == (
        "falha_processando",
        True,
        RESCUED_LAST,
    )
    assert (dead.dead, dead.live_id) == (True, task_id)


# --------------------------------------------------------------- the rescue's reach
def test_rescue_finds_a_lost_task_behind_150_running_ones(
    engine: Engine, app: App, installed: None
) -> None:
    ids = enqueue(engine, app, *({"n": n} for n in range(151)))
    busy, dying = runner(app.RecordingWorker, engine), runner(app.RecordingWorker, engine)
    with busy.adapter.connect_claim(engine) as busy_claim:
        assert [t.id for t in busy.manager.claim(busy_claim, limit=150)] == ids[:150]
        dying_claim = dying.adapter.connect_claim(engine)
        assert [t.id for t in dying.manager.claim(dying_claim, limit=1)] == ids[150:]
        if engine.dialect.name == "sqlite":
            expire_lease(engine, app, ids[150])
        else:
            # the worker died: its connection, and the per-task lock, with it
            kill_backend(engine, backend_id(dying_claim))
            dying_claim.invalidate()
        rescuer = runner(app.RecordingWorker, engine)
        with rescuer.adapter.connect_maintenance(engine) as conn:
            wait_until(lambda: rescuer.manager.rescue(conn) == 1, message="the lost task's rescue")
        status = {t.id: t.status for t in tasks(engine, app)}
        assert status[ids[150]] == "falha_processando"
        assert {status[i] for i in ids[:150]} == {"processando"}


# --------------------------------------------------------------- promotion
@servers
def test_promotion_skips_a_due_row_an_application_transaction_holds(
    engine: Engine, app: App, installed: None
) -> None:
    past = utcnow() - dt.timedelta(minutes=1)
    ids = enqueue(engine, app, {"n": 1}, {"n": 2}, {"n": 3}, status="agendada", run_at=past)
    worker = runner(app.RecordingWorker, engine)
    promoted: list[int] = []
    with engine.connect() as application, application.begin():
        application.execute(select(app.Task).where(app.Task.id == ids[0]).with_for_update())
        with worker.adapter.connect_claim(engine) as claim:
            thread = threading.Thread(
                target=lambda: promoted.append(promote_due(worker, claim)), daemon=True
            )
            thread.start()
            thread.join(timeout=10)
            assert not thread.is_alive(), "promotion waited for the application's lock"
    assert promoted == [2]
    assert [t.status for t in tasks(engine, app)] == ["agendada", "pendente", "pendente"]


# --------------------------------------------------------------- GET_LOCK names
@pytest.fixture
def second_mysql_database(db_url: str) -> Iterator[str]:
    name = f"sqlaq_{uuid.uuid4().hex[:8]}"
    admin = create_engine(db_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield str(admin.url.set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE {name}"))
        admin.dispose()


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_one_queue_table_in_two_databases_shares_no_lock(
    engine: Engine, app: App, installed: None, second_mysql_database: str
) -> None:
    other = create_engine(second_mysql_database)
    app.Base.metadata.create_all(other)
    try:
        [first] = enqueue(engine, app, {"n": 1})
        [second] = enqueue(other, app, {"n": 1})
        assert first == second  # the same id, hence the same lock name before the fix
        here, there = runner(app.RecordingWorker, engine), runner(app.RecordingWorker, other)
        with (
            here.adapter.connect_claim(engine) as here_claim,
            there.adapter.connect_claim(other) as there_claim,
        ):
            assert [t.id for t in here.manager.claim(here_claim, limit=1)] == [first]
            assert [t.id for t in there.manager.claim(there_claim, limit=1)] == [second]
    finally:
        app.Base.metadata.drop_all(other)
        other.dispose()


# --------------------------------------------------------------- transaction state
@pytest.fixture
def rls_engine(db_url: str, engine: Engine, table_name: str) -> Iterator[tuple[Engine, str]]:
    """A role without superuser rights (superusers bypass row-level
    security), and a table whose rows only the current tenant sees."""
    role = f"sqlaq_{uuid.uuid4().hex[:8]}"
    docs = f"{table_name}_docs"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"CREATE TABLE {docs} (id serial PRIMARY KEY, tenant int NOT NULL)"))
        conn.execute(text(f"ALTER TABLE {docs} ENABLE ROW LEVEL SECURITY"))
        conn.execute(
            text(
                f"CREATE POLICY by_tenant ON {docs} USING "
                "(tenant = NULLIF(current_setting('app.tenant', true), '')::int)"
            )
        )
        for table in (table_name, f"{table_name}_effect", docs):
            conn.execute(text(f"GRANT ALL ON {table} TO {role}"))
        conn.execute(text(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"))
        conn.execute(text(f"INSERT INTO {docs} (tenant) VALUES (1), (2), (2)"))
    as_role = create_engine(engine.url.set(username=role))
    try:
        yield as_role, docs
    finally:
        as_role.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {docs}"))
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_claim_commits_without_flush_and_nothing_else_does(
    engine: Engine, app: App, table_name: str, installed: None
) -> None:
    """The claim alone commits with synchronous_commit off (a trigger on the
    queue table records the setting each write runs under); the completion
    keeps the server's setting, and so does the claim connection's session
    (behind PgBouncer another client would inherit a session SET)."""
    seen, trigger = f"{table_name}_seen", f"{table_name}_sync"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {seen} (status text, sync text)"))
        conn.execute(
            text(
                f"CREATE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"INSERT INTO {seen} VALUES (NEW.status, "
                "current_setting('synchronous_commit')); RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER {trigger} BEFORE UPDATE ON {table_name} "
                f"FOR EACH ROW EXECUTE FUNCTION {trigger}()"
            )
        )
    try:
        enqueue(engine, app, {"n": 1})
        worker = runner(app.RecordingWorker, engine)
        with worker.adapter.connect_claim(engine) as claim, engine.connect() as work:
            running = worker.manager.claim(claim, limit=1)
            result = worker.manager.run_batch(claim, work, running, worker.worker.dispatch)
            session_setting = claim.exec_driver_sql("SHOW synchronous_commit").scalar_one()
        assert result.succeeded == 1
        assert session_setting == "on"
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT status, sync FROM {seen}")).all()
        assert sorted(tuple(row) for row in rows) == [("processando", "off"), ("sucesso", "on")]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {seen}"))
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger} ON {table_name}"))
            conn.execute(text(f"DROP FUNCTION {trigger}()"))


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_row_level_security_tenant_switch_does_not_leak_to_the_next_task(
    engine: Engine, app: App, installed: None, rls_engine: tuple[Engine, str]
) -> None:
    """The usual RLS pattern: a handler sets its tenant for its transaction
    only (``set_config(..., true)``) and reads what that tenant sees. A task
    that sets no tenant must see nothing, not the previous task's rows: with
    ``transaction_per_task`` every task has a transaction of its own."""
    as_role, docs = rls_engine
    seen: list[tuple[int | None, int]] = []

    class Tenanted(app.RecordingWorker):  # type: ignore[name-defined,misc]
        transaction_per_task = True

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            if payload["tenant"] is not None:
                session.execute(
                    text("SELECT set_config('app.tenant', :t, true)"), {"t": str(payload["tenant"])}
                )
            count = session.execute(text(f"SELECT count(*) FROM {docs}")).scalar_one()
            seen.append((payload["tenant"], count))
            return None

    enqueue(engine, app, {"tenant": 2}, {"tenant": None}, {"tenant": 1}, {"tenant": None})
    drain(Tenanted, as_role)
    assert seen == [(2, 2), (None, 0), (1, 1), (None, 0)]


# --------------------------------------------------------------- the user's columns
def test_columns_added_to_the_model_are_carried_to_retry_and_dead_rows(
    engine: Engine, table_name: str, installed: None
) -> None:
    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = f"{table_name}_own"
        region: Mapped[str] = mapped_column(String(10), nullable=False)
        batch_no: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))

    class Failing(WorkerBase):
        model = Task
        max_retry = 2
        retry_interval_minutes = 0

        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            assert task.extra == {"region": "sul", "batch_no": 7}
            raise RuntimeError("no")

    Base.metadata.create_all(engine)
    try:
        with Session(engine) as session, session.begin():
            session.add(Task(process="p", payload={"n": 1}, region="sul", batch_no=7))
        drain(Failing, engine)
        with Session(engine) as session:
            rows = session.execute(
                select(Task.attempt, Task.dead, Task.status, Task.region, Task.batch_no).order_by(
                    Task.id
                )
            ).all()
        assert [tuple(row) for row in rows] == [
            (1, False, "falha", "sul", 7),
            (2, False, "falha", "sul", 7),
            (1, True, "sucesso", "sul", 7),
        ]
    finally:
        Base.metadata.drop_all(engine)


# --------------------------------------------------------------- a crash after the claim
def test_a_crash_after_an_unflushed_claim_loses_no_completion_and_runs_nothing_twice(
    private_postgres: PrivatePostgres, table_name: str, installed: None
) -> None:
    """The claim commits without waiting for its WAL flush; the completion
    waits for its own, which covers the claim's record before it. On a
    cluster whose commits are durable (the test clusters' default turns
    that off), with the WAL writer slowed so that an unflushed claim stays
    unflushed: a batch completed before a crash (SIGKILL of every server
    process) is still completed after it, and a batch claimed but not run
    is run once afterwards, whether its claim survived (then rescued) or
    not (then pending again)."""
    with private_postgres.connect() as admin:
        admin.execute("ALTER SYSTEM SET synchronous_commit = on")
        admin.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        admin.execute("SELECT pg_reload_conf()")
    app = build(table_name)
    engine = private_postgres.engine(pool_pre_ping=True)
    app.Base.metadata.create_all(engine)
    done_id, claimed_id = enqueue(engine, app, {"n": 1}, {"n": 2})

    worker = runner(app.RecordingWorker, engine)
    with worker.adapter.connect_claim(engine) as claim, engine.connect() as work:
        [first] = worker.manager.claim(claim, limit=1)
        result = worker.manager.run_batch(claim, work, [first], worker.worker.dispatch)
        [second] = worker.manager.claim(claim, limit=1)
        private_postgres.kill()
    assert (first.id, second.id, result.succeeded) == (done_id, claimed_id, 1)
    private_postgres.start()
    engine.dispose()

    after_crash = {task.id: task.status for task in tasks(engine, app)}
    assert after_crash[done_id] == "sucesso"  # the completion's flush took the claim with it
    # here the claim is lost (pendente) in each run seen; a flushed one would
    # be rescued instead
    assert after_crash[claimed_id] in ("processando", "pendente")
    assert effects(engine, app) == [(done_id, done_id, "{'n': 1}")]

    drain(app.RecordingWorker, engine)  # the start-up rescue sees the dead claim's lock gone
    finished = [t for t in tasks(engine, app) if t.status == "sucesso"]
    assert sorted(t.initial_id or t.id for t in finished) == [done_id, claimed_id]
    assert sorted(chain for _, chain, _ in effects(engine, app)) == [done_id, claimed_id]
    engine.dispose()


# ------------------------------------------------------------ idle timeouts
def _idle_timeout_engine(engine: Engine) -> Engine:
    """The same database, every session ended by the server after about a
    second without a statement (PostgreSQL's idle_session_timeout, MariaDB's
    wait_timeout), as a strict server or a proxy configuration would. Not
    shorter: a new connection is idle from its login to its first statement
    (the worker's own settings turn the timeout off), which a loaded CI
    machine stretched past 500 ms."""
    if engine.dialect.name == "postgresql":
        args = {"options": "-c idle_session_timeout=1000"}
    else:
        args = {"init_command": "SET SESSION wait_timeout = 1"}
    return create_engine(engine.url, connect_args=args)


def _session_idle_for(engine: Engine, backend: int) -> float | None:
    """Seconds the server session ``backend`` has been idle; None once it is gone."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = (
                "SELECT EXTRACT(EPOCH FROM clock_timestamp() - state_change) "
                "FROM pg_stat_activity WHERE pid = :id"
            )
        else:
            query = "SELECT time FROM information_schema.PROCESSLIST WHERE id = :id"
        value = conn.execute(text(query), {"id": backend}).scalar()
    return None if value is None else float(value)


@servers
def test_an_idle_timeout_shorter_than_a_handler_does_not_get_a_healthy_task_rescued(
    engine: Engine, app: App, installed: None
) -> None:
    """The lane's claim connection is idle while the handler runs. A server
    that ends idle sessions must not end it: its per-task lock would go
    with it, the rescue would read the free lock as a dead worker while the
    heartbeat keeps the lease alive, and the task would be run again (and
    reach the dead letter) though its worker is healthy."""
    [task_id] = enqueue(engine, app, {"n": 1})
    strict = _idle_timeout_engine(engine)
    worker, rescuer = runner(app.RecordingWorker, strict), runner(app.RecordingWorker, engine)
    started, go = threading.Event(), threading.Event()
    outcome: list[Any] = []

    def handler(task: Any, session: Session) -> Any:
        # a long handler that talks to its database now and then (MariaDB's
        # wait_timeout also ends a session idle inside a transaction)
        started.set()
        while not go.wait(0.2):
            session.execute(text("SELECT 1"))
        return worker._handle(task, session)

    def lane() -> None:
        try:
            with (
                worker.adapter.connect_claim(strict) as claim_conn,
                strict.connect() as work_conn,
            ):
                [task] = worker.manager.claim(claim_conn, limit=1)
                outcome.append(backend_id(claim_conn))
                outcome.append(worker.manager.run_batch(claim_conn, work_conn, [task], handler))
        except BaseException as exc:
            outcome.append(exc)
            started.set()

    thread = threading.Thread(target=lane)
    thread.start()
    try:
        assert started.wait(60)
        backend = outcome[0]
        assert isinstance(backend, int), outcome
        # the claim connection stays idle well past the server's limit (it
        # is gone, or idle for over three times the limit)
        wait_until(
            lambda: (idle := _session_idle_for(engine, backend)) is None or idle >= 3.5,
            timeout=60,
            message="the claim connection to be idle past the server's timeout",
        )
        assert _session_idle_for(engine, backend) is not None, "the server ended it"
        assert rescue(rescuer) == 0
    finally:
        go.set()
        thread.join(60)
        strict.dispose()
    assert outcome[1].succeeded == 1, outcome
    assert [(t.id, t.status, t.attempt) for t in tasks(engine, app)] == [(task_id, "sucesso", 1)]
    assert len(effects(engine, app)) == 1


@servers
def test_the_worker_connections_session_settings_go_back_to_the_servers_at_check_in(
    engine: Engine, app: App
) -> None:
    """The claim connection's own settings (no idle end, no sequential scans
    on PostgreSQL) never reach a handler's or the application's session,
    which may take the same pooled connection next."""
    pooled = create_engine(engine.url, pool_size=1, max_overflow=0)
    worker = runner(app.RecordingWorker, engine)  # its adapter, on the small pool below
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT current_setting('idle_session_timeout'), current_setting('enable_seqscan'), "
            "current_setting('jit'), current_setting('plan_cache_mode')"
        )
        own, server = ("0", "off", "off", "force_generic_plan"), ("0", "on", "on", "auto")
    else:
        query = "SELECT @@SESSION.wait_timeout = @@GLOBAL.wait_timeout, @@SESSION.wait_timeout"
        own, server = (0, 31_536_000), (1, None)
    try:
        with worker.adapter.connect_claim(pooled) as claim_conn:
            backend = backend_id(claim_conn)
            assert tuple(claim_conn.execute(text(query)).one()) == own
            claim_conn.rollback()
        with pooled.connect() as conn:
            assert backend_id(conn) == backend  # the same server session, back from the pool
            values = tuple(conn.execute(text(query)).one())
        assert values[0] == server[0]
        if engine.dialect.name == "postgresql":
            assert values[1:] == server[1:]
    finally:
        pooled.dispose()


# ------------------------------------------------------------ lanes of one process
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_lane_never_drops_another_lanes_claim_of_the_same_task(
    engine: Engine, app: App, installed: None
) -> None:
    """Two lanes of one process share its worker_id. Lane A hands its task
    back (a stop); before its batch ends, lane B claims the same row again
    (SQLite has no per-task lock to keep it out meanwhile). Lane A's batch
    end must not drop lane B's claim from the set the heartbeat renews."""
    from sqla_queue.policies.leases import Claims

    first, task_id = enqueue(engine, app, {"n": 1}, {"n": 2})
    worker = runner(app.RecordingWorker, engine)
    a_ending, b_claimed = threading.Event(), threading.Event()

    class Orchestrated(Claims):
        def discard(self, ids: Any) -> None:
            if threading.current_thread().name == "lane-a":
                a_ending.set()
                assert b_claimed.wait(30)
            super().discard(ids)

    claims = Orchestrated(worker.app.claims.owner)
    worker.app.claims = worker.manager.claims = worker.heartbeat.claims = claims
    errors: list[BaseException] = []

    def lane_a() -> None:
        try:
            with engine.connect() as claim_conn, engine.connect() as work_conn:
                tasks_a = worker.manager.claim(claim_conn, limit=2)
                assert [t.id for t in tasks_a] == [first, task_id]
                # a stop: the first task runs, the second goes back
                result = worker.manager.run_batch(
                    claim_conn, work_conn, tasks_a, worker._handle, lambda: True
                )
                assert result.handed_back == [task_id]
        except BaseException as exc:
            errors.append(exc)
            a_ending.set()

    thread = threading.Thread(target=lane_a, name="lane-a")
    thread.start()
    try:
        assert a_ending.wait(30)
        assert not errors, errors
        assert [t.status for t in tasks(engine, app)] == ["sucesso", "pendente"]
        with engine.connect() as claim_conn:
            assert [t.id for t in worker.manager.claim(claim_conn, limit=1)] == [task_id]
    finally:
        b_claimed.set()
        thread.join(30)
    assert not errors, errors
    assert claims.snapshot() == [task_id]  # lane B's claim, still renewed
    assert worker.heartbeat.renew_once() == 1


# --------------------------------------------------------------- the claim on the cursor
@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """The statements SQLAlchemy sends on ``engine`` while the test runs (a
    listener, so the adapter's DBAPI-cursor paths step aside)."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _claimed_rows_as_fetched(worker: Runner, engine: Engine, ids: list[int]) -> list[Any]:
    adapter = worker.adapter
    with engine.connect() as conn:
        found = adapter._fetch_records(conn, adapter._rows_by_id, {"ids": ids})  # type: ignore[attr-defined]
    return sorted(found, key=lambda task: ids.index(task.id))


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_claim_on_the_driver_cursor_returns_what_sqlalchemy_returns(
    engine: Engine, app: App, installed: None, request: pytest.FixtureRequest
) -> None:
    """On PostgreSQL the claim runs on the DBAPI cursor unless something
    watches the connection's statements. Both ways give the same records:
    every column as read back afterwards, a retry's payload from its first
    attempt, the claim order (priority, time, id)."""
    first = enqueue(engine, app, {"n": "first"})[0]
    with Session(engine) as session, session.begin():  # a retry: no payload of its own
        session.add(app.Task(process="faturar", initial_id=first, attempt=2))
    enqueue(engine, app, {"n": "urgent"}, priority=90)
    enqueue(engine, app, {"n": 1}, {"n": 2}, external_key="k")
    worker = runner(app.RecordingWorker, engine)
    with worker.adapter.connect_claim(engine) as claim:
        on_cursor = worker.manager.claim(claim, limit=3)
        assert worker.adapter._direct_claims  # type: ignore[attr-defined]
        sent = request.getfixturevalue("statements")
        through_sqlalchemy = worker.manager.claim(claim, limit=3)
        assert any("FOR UPDATE SKIP LOCKED" in statement for statement in sent)
    claimed = on_cursor + through_sqlalchemy
    assert [task.payload for task in claimed] == [
        {"n": "urgent"},
        {"n": "first"},
        {"n": "first"},  # the retry, its payload from the first attempt
        {"n": 1},
        {"n": 2},
    ]
    ids = [task.id for task in claimed]
    # repr, not ==: the datetimes' time zone too (UtcDateTime's result processor)
    assert [repr(task) for task in claimed] == [
        repr(task) for task in _claimed_rows_as_fetched(worker, engine, ids)
    ]
    assert all(task.status == "processando" and task.worker_id for task in claimed)


@pytest.mark.parametrize("path", ["cursor", "sqlalchemy"])
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_claimed_row_whose_lock_another_session_holds_goes_back(
    engine: Engine, app: App, installed: None, path: str, request: pytest.FixtureRequest
) -> None:
    """A task whose per-task lock key (the low 32 bits of its id) another
    session holds is not run: the claim hands it back to ``pendente`` and
    returns the others, on the cursor's path as on SQLAlchemy's."""
    if path == "sqlalchemy":
        request.getfixturevalue("statements")
    held, free = enqueue(engine, app, {"n": 1}, {"n": 2})
    worker = runner(app.RecordingWorker, engine)
    key = {"ns": worker.adapter.task_lock_namespace, "objid": held % 2**32 - 2**31}
    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:ns, :objid)"), key)
        with worker.adapter.connect_claim(engine) as claim:
            assert [task.id for task in worker.manager.claim(claim, limit=2)] == [free]
        holder.execute(text("SELECT pg_advisory_unlock(:ns, :objid)"), key)
        holder.commit()
    rows = {task.id: task for task in tasks(engine, app)}
    assert (rows[held].status, rows[held].worker_id) == ("pendente", None)
    assert rows[free].status == "processando"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_claim_filter_computed_at_each_claim_stays_on_sqlalchemys_path(
    engine: Engine, app: App, installed: None
) -> None:
    """``item_delay``'s cut-off is a bind SQLAlchemy computes at every
    execution: a claim compiled once for the cursor would keep the first
    one, so that claim is never compiled for it."""

    enqueue(engine, app, {"n": 1})
    delayed = Settings.from_env({"SQLA_QUEUE_ITEM_DELAY": "3600"})
    worker = Runner.for_worker(app.RecordingWorker(), engine=engine, settings=delayed)
    assert worker.adapter._direct_claim(engine.dialect, 1) is None  # type: ignore[attr-defined]
    with worker.adapter.connect_claim(engine) as claim:
        assert worker.manager.claim(claim, limit=1) == []


@pytest.mark.parametrize("path", ["cursor", "sqlalchemy"])
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_of_ones_completion_and_lock_release_on_either_path(
    engine: Engine, app: App, installed: None, path: str, request: pytest.FixtureRequest
) -> None:
    """A batch of one task completes (guarded by the claim) and frees the
    task's lock after its commit through the DBAPI cursor on PostgreSQL, as
    through SQLAlchemy when something watches the statements."""
    sent = request.getfixturevalue("statements") if path == "sqlalchemy" else None
    first, second = enqueue(engine, app, {"n": 1}, {"n": 2})
    worker = runner(app.RecordingWorker, engine)
    adapter, manager = worker.adapter, worker.manager
    key = {"ns": adapter.task_lock_namespace}
    free = text("SELECT pg_try_advisory_lock(:ns, :objid), pg_advisory_unlock_all()")
    with adapter.connect_claim(engine) as claim, engine.connect() as work:
        [task] = manager.claim(claim, limit=1)
        assert task.id == first
        with engine.connect() as other:  # held by the claim's session
            assert other.execute(free, {**key, "objid": first - 2**31}).first()[0] is False
        result = manager.run_batch(claim, work, [task], lambda task, session: "feito")
        assert (result.succeeded, result.failed, result.handed_back) == (1, 0, [])
        with engine.connect() as other:  # freed after the batch's commit
            assert other.execute(free, {**key, "objid": first - 2**31}).first()[0] is True
        # the guard: a task no longer claimed by this owner is not completed
        [task] = manager.claim(claim, limit=1)
        assert task.id == second
        with work.begin():
            results = [(second, None)]
            assert adapter.task_complete_many(work, results=results, owner="another") == 0
            assert adapter.task_complete_many(work, results=results, owner=manager.owner) == 1
    done = {task.id: task for task in tasks(engine, app)}
    assert (done[first].status, done[first].message) == ("sucesso", "feito")
    assert (done[second].status, done[second].message) == ("sucesso", "Concluído com sucesso")
    assert done[first].finished_at is not None and done[second].finished_at is not None
    compiled = adapter._direct_statements  # type: ignore[attr-defined]
    if sent is None:
        assert len(compiled) == 2 and None not in compiled.values()
    else:
        assert not compiled
        assert any("pg_advisory_unlock" in statement for statement in sent)
        assert any(statement.startswith("UPDATE") and "mensagem" in statement for statement in sent)


@contextlib.contextmanager
def _protocol_trace(conn: Any, path: Path) -> Iterator[None]:
    """libpq's trace of what ``conn`` (a SQLAlchemy connection on psycopg 3)
    sends and receives, written to ``path``."""
    pgconn = conn.connection.dbapi_connection.pgconn
    with path.open("w") as out:
        pgconn.trace(out.fileno())
        try:
            yield
        finally:
            pgconn.untrace()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_of_one_that_wrote_nothing_completes_in_one_round_trip(
    engine: Engine, app: App, installed: None, tmp_path: Path
) -> None:
    """A batch of one whose handler sent nothing completes in autocommit
    (no BEGIN, no COMMIT: the transaction would have held that statement
    alone); a handler's write keeps the completion in its transaction."""
    quiet, writes = enqueue(engine, app, {"n": 1}, {"n": 2})
    worker = runner(app.RecordingWorker, engine)
    adapter, manager = worker.adapter, worker.manager

    def handler(task: Any, session: Session) -> str:
        if task.id == writes:
            session.add(app.Effect(task_id=task.id, chain_id=task.chain_id, note="escrito"))
        return "feito"

    sent = {}
    with adapter.connect_claim(engine) as claim, engine.connect() as work:
        for task_id in (quiet, writes):
            [task] = manager.claim(claim, limit=1)
            assert task.id == task_id
            trace = tmp_path / f"{task_id}.trace"
            with _protocol_trace(work, trace):
                assert manager.run_batch(claim, work, [task], handler).succeeded == 1
            assert work.connection.dbapi_connection.autocommit is False
            sent[task_id] = trace.read_text()
    begin, commit = '\tQuery\t "BEGIN"', '\tQuery\t "COMMIT"'  # as the client sends them
    assert begin not in sent[quiet] and commit not in sent[quiet]
    assert "UPDATE" in sent[quiet]
    assert sent[writes].count(begin) == 1 and sent[writes].count(commit) == 1
    done = {task.id: task for task in tasks(engine, app)}
    assert {done[quiet].status, done[writes].status} == {"sucesso"}
    assert effects(engine, app) == [(writes, writes, "escrito")]


# --------------------------------------------------------------- the warm-up
def test_a_lane_s_warm_up_runs_the_completion_and_changes_nothing(
    engine: Engine, observer: Engine, app: App, installed: None
) -> None:
    """A lane's warm-up (docs/lifecycle.md, "Warm lanes") sends the
    completion's statements on its work connection, matching no row, and
    leaves no transaction open: a claimed task stays claimed, a ready one
    ready, and the connection is as it was."""
    claimed_id, ready_id = enqueue(engine, app, {"n": 1}, {"n": 2})
    worker = runner(app.RecordingWorker, engine)
    table = app.Task.__table__.name
    sent: list[str] = []
    with worker.adapter.connect_claim(engine) as claim, engine.connect() as work:
        [task] = worker.manager.claim(claim, limit=1)
        assert task.id == claimed_id
        # observed, every adapter sends through conn.execute (no driver fast path)
        event.listen(work, "before_cursor_execute", lambda *args: sent.append(args[2]))
        before = _statuses(observer, app)
        worker.manager.warm(work)
        assert not work.in_transaction()
        assert _statuses(observer, app) == before
        assert before[claimed_id][0] == "processando" and before[ready_id][0] == "pendente"
    assert sum(table in statement for statement in sent) >= 3, sent


def _statuses(engine: Engine, app: App) -> dict[int, tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(app.Task.id, app.Task.status, app.Task.worker_id))
        return {row[0]: (row[1], row[2]) for row in rows}
