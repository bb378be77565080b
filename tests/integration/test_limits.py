"""Fleet-wide concurrency limits (sqla_queue/policies/limits.py, docs/limits.md):
4 worker processes of 4 lanes each (threads, or coroutines for the async
worker) never run more than 2 tasks of a
limited process at once, on every database, while an unlimited process
beside it runs on more lanes than that (so that the measure can see an
excess; not on SQLite, where one batch runs at a time); every task runs
once."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError, QueueApp, QueueClient
from sqla_queue.config.settings import Settings
from tests.acceptance.test_concurrency import (
    effects,
    lease_expired,
    spawned,
    stop_gracefully,
    worker_env,
)
from tests.conftest import wait_until
from tests.support.app import App
from tests.support.limits_app import LIMIT, RATE, most_at_once, spans


@pytest.mark.parametrize("worker", ["LimitedWorker", "AsyncLimitedWorker"])
def test_a_limited_process_never_runs_past_its_limit_across_the_fleet(
    engine: Engine, app: App, db_url: str, tmp_path: Path, worker: str
) -> None:
    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {"n": n}} for n in range(40)]
            + [{"process": "livre", "payload": {"n": n}} for n in range(40)]
        )
    env = worker_env(app.Task.__table__.name, SQLA_QUEUE_TEST_PROBE=str(tmp_path))
    args = ("worker", f"tests.support.limits_app:{worker}", "--url", db_url)
    # --burst: each exits 0 once nothing is ready (a late starter at once).
    # 4 lanes each: on a loaded machine one process may run most of the
    # tasks before the others start, and must show an excess on its own
    with spawned(*args, "--concurrency", "4", "--burst", env=env, count=4) as workers:
        for process in workers:
            assert process.wait(timeout=90) == 0, process.output
    done = effects(engine, app)
    assert len(done) == len({task_id for task_id, _, _ in done}) == 80  # each once
    assert 1 <= most_at_once(tmp_path, "limitado") <= LIMIT
    # the fleet did run tasks side by side: the unlimited process, past the
    # limit. Not on SQLite, whose one writer runs one batch at a time
    if engine.dialect.name != "sqlite":
        assert most_at_once(tmp_path, "livre") > LIMIT


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"p": 0}, r"concurrency_limits\['p'\] must be a whole number of at least 1"),
        ({"p": True}, "must be a whole number"),
        ({"": 2}, "a process must be a non-empty string"),
        ([("p", 2)], "must be a mapping of process to a number"),
    ],
)
def test_a_bad_limit_is_one_clear_error(app: App, limits: Any, message: str) -> None:
    class Bad(app.RecordingWorker):  # type: ignore[name-defined,misc]
        concurrency_limits = limits

    with pytest.raises(ConfigurationError, match=message) as caught:
        Bad.check_configuration()
    assert "\n" not in str(caught.value)


def test_the_main_claim_leaves_limited_processes_to_the_limited_claim(
    engine: Engine, app: App
) -> None:
    """In one process: a claim of 10 takes the limit's 2 tasks of the
    limited process and the rest from the others; the next takes none of
    the limited process while those 2 run."""

    class Worker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        concurrency_limits: ClassVar[dict[str, int]] = {"limitado": 2}

    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {}} for _ in range(5)]
            + [{"process": "livre", "payload": {}} for _ in range(5)]
        )
    queue = QueueApp(Worker(), engine=engine, settings=Settings())
    with queue.adapter.connect_claim(engine) as conn:
        first = queue.manager.claim(conn, limit=10)
        second = queue.manager.claim(conn, limit=10)
    assert sorted(t.process for t in first) == ["limitado"] * 2 + ["livre"] * 5
    assert second == []
    with engine.connect() as conn:
        statuses = conn.execute(select(app.Task.process, app.Task.status)).all()
    assert (
        sorted(s for p, s in statuses if p == "limitado") == ["pendente"] * 3 + ["processando"] * 2
    )


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_limited_backlog_drains_without_waiting_for_a_wake_up(
    engine: Engine, app: App, db_url: str, tmp_path: Path
) -> None:
    """With LISTEN, an idle lane waits for a notification (the fallback
    poll here: a minute). A claim cut short by the limit is not "all there
    was": the lane claims again after its batch, so 12 tasks limited to 1
    at a time finish with no enqueue to wake anyone."""
    env = worker_env(
        app.Task.__table__.name,
        SQLA_QUEUE_TEST_PROBE=str(tmp_path),
        QUEUE_WAIT_NOTIFY_INTERVAL="60",
    )
    # enqueued before the worker starts: no notification is left to wake it
    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {"n": n}} for n in range(12)]
        )
    args = ("worker", "tests.support.limits_app:DrainWorker", "--url", db_url)
    with spawned(*args, "--concurrency", "2", env=env) as workers:
        wait_until(lambda: len(effects(engine, app)) >= 12, timeout=30, message="the backlog")
        wait_until(
            lambda: listening(engine, app.Task.__table__.name), message="the worker to LISTEN"
        )
        stop_gracefully(workers)


def listening(engine: Engine, table: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"' || :t || '\"'"
                ),
                {"t": table},
            ).scalar_one()
        )


def test_a_killed_workers_limited_task_holds_its_slot_until_the_rescue(
    engine: Engine, app: App, db_url: str, tmp_path: Path
) -> None:
    """SIGKILL a worker in the middle of the one task of a process limited
    to 1: the task stays processando and still counts, so a second worker
    runs no task of that process until its rescue has freed the slot (its
    failed attempt's finished_at); then it runs them one at a time, and
    every task once."""
    env = worker_env(
        app.Task.__table__.name,
        SQLA_QUEUE_TEST_PROBE=str(tmp_path),
        SQLA_QUEUE_TEST_SIGNAL_DIR=str(tmp_path),
        SQLA_QUEUE_TEST_LEASE="1",
    )
    with engine.begin() as conn:
        [blocked, *_] = QueueClient(conn, app.Task).insert_tasks(
            [{"process": "limitado", "payload": {"block": True}}]
            + [{"process": "limitado", "payload": {"n": n}} for n in range(3)]
        )
    worker = "tests.support.limits_app:OneAtATimeWorker"
    args = ("worker", worker, "--url", db_url, "--concurrency", "2")
    with spawned(*args, env=env) as [first]:
        wait_until(lambda: (tmp_path / f"started-{blocked}").exists(), message="the task")
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    (tmp_path / "go").touch()
    if engine.dialect.name == "sqlite":  # no lock dies with the worker there
        wait_until(lambda: lease_expired(engine, app, blocked), message="the lease to expire")
    with spawned(*args, "--burst", env=env) as [second]:
        assert second.wait(timeout=90) == 0, second.output
    with Session(engine) as session:
        rows = session.scalars(select(app.Task).order_by(app.Task.id)).all()
    lost = next(row for row in rows if row.id == blocked)
    assert lost.status == "falha_processando" and lost.finished_at is not None
    ran = spans(tmp_path)
    assert sorted(task_id for _, task_id, _, _ in ran) == sorted(
        [row.id for row in rows if row.status == "sucesso"]
    )
    assert len(ran) == 4  # the rescued task's retry and the three others, once each
    freed = lost.finished_at.timestamp()
    assert all(start >= freed for _, _, start, _ in ran), (freed, ran)
    ordered = sorted(ran, key=lambda span: span[2])
    assert all(a[3] <= b[2] for a, b in itertools.pairwise(ordered))  # one at a time


def test_a_rate_limited_process_is_claimed_no_faster_than_its_rate_across_the_fleet(
    engine: Engine, app: App, db_url: str, tmp_path: Path
) -> None:
    """4 worker processes of 2 lanes each, 50 tasks of a process limited to
    20 a second (a bucket of one second's worth): in no second do more than
    40 start (the full bucket, then its refill), and the last starts at
    least (50 - 20) / 20 = 1.5 s after the first, where the same tasks
    unlimited take a fraction of a second; every task runs once."""
    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "medido", "payload": {"n": n}} for n in range(50)]
        )
    env = worker_env(app.Task.__table__.name, SQLA_QUEUE_TEST_PROBE=str(tmp_path))
    args = ("worker", "tests.support.limits_app:RatedWorker", "--url", db_url)
    with spawned(*args, "--concurrency", "2", "--burst", env=env, count=4) as workers:
        for worker in workers:
            assert worker.wait(timeout=90) == 0, worker.output
    done = effects(engine, app)
    assert len(done) == len({task_id for task_id, _, _ in done}) == 50
    assert len(spans(tmp_path)) == 50
    # when each was claimed: started_at, written by the claim itself (a
    # handler's own start lags its claim by however busy the machine is)
    with engine.connect() as conn:
        claimed = sorted(
            at.timestamp() for at in conn.execute(select(app.Task.started_at)).scalars()
        )
    for i, start in enumerate(claimed):
        in_a_second = sum(1 for other in claimed[i:] if other < start + 1.0)
        assert in_a_second <= 2 * RATE, (in_a_second, claimed)
    # the bucket's clock is read just before the claim writes started_at
    assert claimed[-1] - claimed[0] >= (50 - RATE) / RATE - 0.1, claimed


def test_a_bad_rate_is_one_clear_error(app: App) -> None:
    for rates, message in (
        ({"p": 0}, r"rate_limits\['p'\] must be a number of tasks per second"),
        ({"p": "5"}, "must be a number of tasks per second"),
        ({"": 5}, "a process must be a non-empty string"),
    ):

        class Bad(app.RecordingWorker):  # type: ignore[name-defined,misc]
            rate_limits = rates

        with pytest.raises(ConfigurationError, match=message) as caught:
            Bad.check_configuration()
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_throttled_lane_waits_for_its_next_token_not_for_a_wake_up(
    engine: Engine, app: App, db_url: str, tmp_path: Path
) -> None:
    """With LISTEN and a one-minute fallback poll, 30 tasks limited to 20 a
    second, enqueued before the worker starts (no notification left): a
    lane the bucket stopped claims again at its next token."""
    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"process": "medido", "payload": {"n": n}} for n in range(30)]
        )
    env = worker_env(
        app.Task.__table__.name,
        SQLA_QUEUE_TEST_PROBE=str(tmp_path),
        QUEUE_WAIT_NOTIFY_INTERVAL="60",
    )
    args = ("worker", "tests.support.limits_app:RatedWorker", "--url", db_url)
    with spawned(*args, "--concurrency", "2", env=env) as workers:
        wait_until(lambda: len(effects(engine, app)) >= 30, timeout=20, message="the backlog")
        wait_until(
            lambda: listening(engine, app.Task.__table__.name), message="the worker to LISTEN"
        )
        stop_gracefully(workers)


def test_the_purge_deletes_the_rate_buckets_that_are_full_and_keeps_the_others(
    engine: Engine, app: App
) -> None:
    """A bucket full by now is what no row means: the purge deletes it
    (``rate_buckets`` in its counts; a dry run counts and keeps it). A
    bucket still refilling stays, and so does a row without its rate
    (written before the rate was kept). The next claim of a forgotten
    bucket finds it full."""
    from sqla_queue.adapters import adapter_of
    from sqla_queue.adapters.limits import RateBuckets
    from sqla_queue.maintenance import Every, PurgeRoutine
    from sqla_queue.policies.limits import claim_within_rate
    from sqla_queue.schema.configuration_table import (
        configuration_table_of,
        ensure_table,
        has_queue_name,
    )

    settings = configuration_table_of(app.Task)
    ensure_table(engine, settings)
    adapter = adapter_of(engine.dialect, app.Task.__table__)

    def prepare() -> bool:
        with engine.connect() as conn:
            return has_queue_name(conn, settings)

    buckets = RateBuckets(settings, app.Task.__table__.name, prepare=prepare)
    clock = adapter.limits

    def claim(subject: str, rate: float, want: int) -> int:
        with engine.begin() as conn:
            now = clock.now(conn).timestamp()
            taken, _ = claim_within_rate(
                conn, buckets, subject, rate, now, want, lambda n: [object()] * n, note="test"
            )
            return len(taken)

    assert claim("fast", 1000.0, 3) == 3  # full again 3 ms later
    assert claim("slow", 0.001, 1) == 1  # full again in 1,000 s
    with engine.begin() as conn:  # a row from before the rate was kept: stays
        conn.execute(
            settings.insert().values(
                setting_name=buckets.name("old"),
                queue_name=app.Task.__table__.name,
                value="0 0",
                casted_as="TEXT",
            )
        )

    def names() -> set[str]:
        with engine.connect() as conn:
            found = conn.execute(select(settings.c.setting_name)).scalars()
            return {name for name in found if name.startswith("rate:")}

    every = {buckets.name(subject) for subject in ("fast", "slow", "old")}
    assert names() == every
    # the bucket's clock is the database's: wait on it, past the second's margin
    with engine.connect() as conn:
        written = clock.now(conn).timestamp()

    def later() -> bool:
        with engine.connect() as conn:
            return clock.now(conn).timestamp() > written + 1.1

    wait_until(later, timeout=10, message="the database clock to move on")
    purge = PurgeRoutine(engine, adapter, Every(3600), buckets=buckets)
    assert purge.run_once(dry_run=True).counts["rate_buckets"] == 1
    assert names() == every
    result = purge.run_once()
    assert result.error is None
    assert result.counts["rate_buckets"] == 1
    assert names() == every - {buckets.name("fast")}
    # forgotten is full: the next claim may take a whole second's worth
    assert claim("fast", 1000.0, 2000) == 1000
    assert claim("slow", 0.001, 1) == 0  # still refilling


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_rate_limited_workers_purge_has_its_buckets(engine: Engine, app: App) -> None:
    """The composition root hands the purge the worker's buckets (what
    ``sqla-queue maintenance run purge`` and the scheduled purge run); a
    worker without rate limits has none to purge."""

    class Rated(app.RecordingWorker):  # type: ignore[name-defined,misc]
        rate_limits: ClassVar[dict[str, float]] = {"medido": 5.0}

    for worker, has in ((Rated, True), (app.RecordingWorker, False)):
        queue = QueueApp(worker(), engine=engine, settings=Settings())
        purge = queue.maintenance.routines["purge"]
        assert (getattr(purge, "buckets", None) is not None) is has, worker


def test_the_bucket_purge_goes_through_every_page(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets still refilling at the start of the names do not hide the
    full ones after them: the purge reads page after page (two rows a page
    here), a transaction each."""
    import sqla_queue.adapters.limits as bucket_module
    from sqla_queue.adapters import adapter_of
    from sqla_queue.adapters.limits import RateBuckets
    from sqla_queue.maintenance import Every, PurgeRoutine
    from sqla_queue.schema.configuration_table import (
        configuration_table_of,
        ensure_table,
        has_queue_name,
    )

    monkeypatch.setattr(bucket_module, "FORGET_LIMIT", 2)
    settings = configuration_table_of(app.Task)
    ensure_table(engine, settings)
    adapter = adapter_of(engine.dialect, app.Task.__table__)
    with engine.connect() as conn:
        scoped = has_queue_name(conn, settings)
        now = adapter.limits.now(conn).timestamp()
    buckets = RateBuckets(settings, app.Task.__table__.name, scoped=scoped)
    # names in order: two refilling (slow, just written), then three full
    # (fast, written an hour ago), then one refilling
    rows = [("rate:0", 0.001, now), ("rate:1", 0.001, now)]
    rows += [(f"rate:{n}", 1000.0, now - 3600) for n in (2, 3, 4)]
    rows += [("rate:5", 0.001, now)]
    with engine.begin() as conn:
        for name, rate, at in rows:
            conn.execute(
                settings.insert().values(
                    setting_name=name,
                    queue_name=app.Task.__table__.name,
                    value=f"0 {at:.6f}",
                    unit=f"{rate:.12g}/s",
                    casted_as="TEXT",
                )
            )
    result = PurgeRoutine(engine, adapter, Every(3600), buckets=buckets).run_once()
    assert result.error is None
    assert result.counts["rate_buckets"] == 3
    with engine.connect() as conn:
        left = conn.execute(select(settings.c.setting_name)).scalars().all()
    assert sorted(name for name in left if name.startswith("rate:")) == [
        "rate:0",
        "rate:1",
        "rate:5",
    ]
