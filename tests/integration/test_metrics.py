"""Prometheus metrics: scraped from a real worker process, each counter equals
what the table says; a batch rolled back by a lost claim adds nothing."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, and_, func, select, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient
from sqla_queue.common.types import utcnow
from sqla_queue.config.settings import Settings
from sqla_queue.ops.metrics import (
    OTHER_PROCESS,
    PROCESS_LABEL_MAX_CHARS,
    PROCESS_LABELS_MAX,
    TASK_STATES_EVERY_SECONDS,
    QueueMetrics,
    TaskStates,
)
from sqla_queue.ops.status import queue_status
from sqla_queue.policies.hooks import Hooks
from sqla_queue.worker import Runner
from sqla_queue.worker.app import QueueApp
from tests.conftest import wait_until
from tests.integration.test_claims import expire_lease, rescue, runner
from tests.integration.test_worker import enqueue
from tests.support.app import App

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def outcomes_in_table(engine: Engine, app: App) -> dict[str, int]:
    """Each outcome as the table records it (docs/operations.md, Metrics)."""
    t = app.Task
    conditions = {
        "succeeded": t.status == "sucesso",
        "retried": and_(t.status == "falha", t.requeued.is_(True)),
        "dead": and_(t.status == "falha", t.retries_exhausted.is_(True), t.dead.is_(False)),
        "failed": and_(t.status == "falha", t.retries_exhausted.is_(True), t.dead.is_(True)),
        "rescued": t.status == "falha_processando",
    }
    with engine.connect() as conn:
        return {
            name: int(conn.execute(select(func.count()).select_from(t).where(c)).scalar_one())
            for name, c in conditions.items()
        }


@contextlib.contextmanager
def worker_process(db_url: str, table: str, port: int, *extra: str) -> Iterator[Any]:
    env = {
        **os.environ,
        "SQLA_QUEUE_TEST_TABLE": table,
        "PYTHONPATH": REPO,
        "QUEUE_MAX_RETRY": "2",
        "SQLA_QUEUE_METRICS_PORT": str(port),
    }
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "sqla_queue.cli", "worker", "tests.support.app:RecordingWorker",
            "--url", db_url, "--concurrency", "2", "--log-level", "WARNING", *extra,
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


def test_scraped_counters_equal_what_the_table_says(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    table = app.Task.__tablename__
    enqueue(engine, app, *({"n": n} for n in range(20)))
    enqueue(engine, app, *({"fail": f"n{n}"} for n in range(3)))
    # a task whose worker died: the rescue at the worker's start finds it
    [lost] = enqueue(engine, app, {"n": "lost"})
    with engine.begin() as conn:
        conn.execute(
            update(app.Task)
            .where(app.Task.id == lost)
            .values(status="processando", worker_id="gone:1:dead", started_at=utcnow())
        )
    expire_lease(engine, app, lost)
    # a task cancelled before it ran: a state only the gauge of states shows
    [later] = enqueue(engine, app, {"n": "later"}, run_at=utcnow() + dt.timedelta(hours=1))
    with engine.begin() as conn:
        QueueClient(conn, app.Task).cancel(later)
    port = free_port()
    with worker_process(db_url, table, port) as proc:

        def finished() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with engine.connect() as conn:
                waiting = conn.execute(
                    select(func.count())
                    .select_from(app.Task)
                    .where(app.Task.status.in_(["pendente", "agendada", "processando"]))
                ).scalar_one()
            return waiting == 0

        wait_until(finished, timeout=90, message="the worker to finish every task")
        expected = outcomes_in_table(engine, app)
        # the scenario is what it says: 20 + 1 rescued retry + 3 dead-letter
        # runs succeeded; 3 failed and retried, then 3 died
        assert expected == {"succeeded": 24, "retried": 3, "dead": 3, "failed": 0, "rescued": 1}

        def counted() -> dict[str, float]:
            samples = scrape(port)
            return {
                outcome: sum(
                    value
                    for (name, labels), value in samples.items()
                    if name == "sqla_queue_tasks_total"
                    and dict(labels).get("outcome") == outcome
                    and dict(labels).get("queue") == table
                )
                for outcome in expected
            }

        # each counter is incremented after its commit: poll until it catches up
        wait_until(lambda: counted() == expected, timeout=30, message="the counters")
        samples = scrape(port)
        queue = (("queue", table),)
        labels = (("process", "faturar"), ("queue", table))
        assert samples[("sqla_queue_lanes", queue)] == 2
        assert 0 <= samples[("sqla_queue_lanes_busy", queue)] <= 2
        # every run that had a handler: the successes and the failures
        assert samples[("sqla_queue_task_duration_seconds_count", labels)] == 24 + 3 + 3
        assert samples[("sqla_queue_task_wait_seconds_count", labels)] == 24 + 3 + 3
        assert samples[("sqla_queue_batch_size_count", queue)] >= 1
        assert samples[("sqla_queue_batch_size_sum", queue)] == 24 + 3 + 3

        # tasks by state: what status counts, cancelled and dead_letter among
        # them (read at most every TASK_STATES_EVERY_SECONDS: may lag a scrape)
        totals = queue_status(engine, app.Task).totals.as_dict()
        assert (totals["cancelled"], totals["dead_letter"], totals["ready"]) == (1, 3, 0)

        def states() -> dict[str, float]:
            return {
                dict(labels)["state"]: value
                for (name, labels), value in scrape(port).items()
                if name == "sqla_queue_tasks_in_state" and dict(labels)["queue"] == table
            }

        wait_until(
            lambda: states() == totals,
            timeout=TASK_STATES_EVERY_SECONDS + 30,
            message="the gauge of tasks by state",
        )


def test_tasks_by_state_are_read_at_most_once_per_interval_and_a_failed_read_is_skipped(
    engine: Engine, app: App, installed: None
) -> None:
    """TaskStates reads the table when scraped, again only once its last
    read is TASK_STATES_EVERY_SECONDS old (the clock injected); a read that
    fails leaves the gauge out of that scrape, and the next read after the
    interval brings it back."""
    enqueue(engine, app, {"n": 1}, {"n": 2})
    now = [0.0]
    reads: list[dict[str, int]] = []
    broken = [False]

    def read() -> dict[str, int]:
        if broken[0]:
            raise ConnectionError("the database is away")
        reads.append(queue_status(engine, app.Task).totals.as_dict())
        return reads[-1]

    registry = CollectorRegistry()
    registry.register(TaskStates("q", read, clock=lambda: now[0]))

    def ready() -> float | None:
        return registry.get_sample_value(
            "sqla_queue_tasks_in_state", {"queue": "q", "state": "ready"}
        )

    assert ready() == 2
    enqueue(engine, app, {"n": 3})
    now[0] = TASK_STATES_EVERY_SECONDS - 0.1
    assert (ready(), len(reads)) == (2, 1)  # the last read, not the table
    now[0] = TASK_STATES_EVERY_SECONDS
    assert (ready(), len(reads)) == (3, 2)
    broken[0] = True
    now[0] = 2 * TASK_STATES_EVERY_SECONDS
    assert ready() is None
    broken[0] = False
    now[0] = 3 * TASK_STATES_EVERY_SECONDS
    assert ready() == 3


#: what a hostile ``processo`` may hold: escapes, quotes, a backslash, line
#: breaks, a bidi override, C1 (no NUL: PostgreSQL's text refuses it)
HOSTILE = '\x1b[31m "quoted" \\ back\nslash\r\t\u202e\x85 '


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_hostile_process_names_keep_the_process_label_bounded(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    """A worker without ``processes`` runs 600 tasks of 600 distinct, long,
    hostile process names (the issue's reproduction had 3,000; six times
    the cap shows the same, in a fifth of the time): the scrape has the
    first 100 as labels (cut, escaped) and ``other`` for the rest, and
    counts all 600."""
    table = app.Task.__tablename__
    total = 6 * PROCESS_LABELS_MAX
    names = [f"p{n:04d}{HOSTILE}".ljust(240, "x") for n in range(total)]
    with Session(engine) as session, session.begin():
        session.add_all(app.Task(payload={"n": n}, process=name) for n, name in enumerate(names))
    port = free_port()
    with worker_process(db_url, table, port) as proc:

        def finished() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with engine.connect() as conn:
                done = conn.execute(
                    select(func.count()).select_from(app.Task).where(app.Task.status == "sucesso")
                ).scalar_one()
            return done == total

        wait_until(finished, timeout=120, message="the worker to finish every task")

        def by_process(sample_name: str) -> dict[str, float]:
            """{process label: value} of the queue's samples (successes only)."""
            counted: dict[str, float] = {}
            for (name, labels), value in scrape(port).items():
                label = dict(labels)
                if (
                    name == sample_name
                    and label["queue"] == table
                    and label.get("outcome", "succeeded") == "succeeded"
                ):
                    counted[label["process"]] = counted.get(label["process"], 0) + value
            return counted

        # each counter is incremented after its commit: poll until it catches up
        wait_until(
            lambda: sum(by_process("sqla_queue_tasks_total").values()) >= total,
            timeout=30,
            message="the counters",
        )
        for sample_name in ("sqla_queue_tasks_total", "sqla_queue_task_duration_seconds_count"):
            counted = by_process(sample_name)
            assert len(counted) == PROCESS_LABELS_MAX + 1, sample_name
            assert sum(counted.values()) == total, sample_name
            assert counted[OTHER_PROCESS] == total - PROCESS_LABELS_MAX, sample_name
            kept = set(counted) - {OTHER_PROCESS}
            assert all(len(label) == PROCESS_LABEL_MAX_CHARS for label in kept)
            assert all(label.isprintable() and label.startswith("p") for label in kept)
            assert all('\\x1b[31m "quoted" \\ back\\x0aslash' in label for label in kept)


def test_a_batch_rolled_back_by_a_lost_claim_counts_nothing(
    engine: Engine, app: App, installed: None
) -> None:
    hooks = Hooks()
    metrics = QueueMetrics(app.Task.__tablename__, registry=CollectorRegistry()).attach(hooks)
    [task_id] = enqueue(engine, app, {"n": 1})
    slow = Runner(QueueApp(app.RecordingWorker(), engine=engine, settings=Settings(), hooks=hooks))
    rescuer = runner(app.RecordingWorker, engine)
    with slow.adapter.connect_claim(engine) as claim, engine.connect() as work:
        running = slow.manager.claim(claim, limit=1)
        expire_lease(engine, app, task_id)
        assert rescue(rescuer) == 1  # another worker's rescue: not these hooks
        result = slow.manager.run_batch(claim, work, running, slow.worker.dispatch)
    assert (result.succeeded, result.failed) == (0, 0)
    registry = metrics.registry
    assert registry.get_sample_value(
        "sqla_queue_tasks_total",
        {"queue": app.Task.__tablename__, "process": "faturar", "outcome": "succeeded"},
    ) in (None, 0.0)
    assert registry.get_sample_value(
        "sqla_queue_batch_size_count", {"queue": app.Task.__tablename__}
    ) in (None, 0.0)
    # the next batch that commits is counted
    later = runner(app.RecordingWorker, engine)
    later.manager.hooks = hooks
    with later.adapter.connect_claim(engine) as claim, engine.connect() as work:
        retry = later.manager.claim(claim, limit=1)
        later.manager.run_batch(claim, work, retry, later.worker.dispatch)
    assert (
        registry.get_sample_value(
            "sqla_queue_tasks_total",
            {"queue": app.Task.__tablename__, "process": "faturar", "outcome": "succeeded"},
        )
        == 1.0
    )
    metrics.detach()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_port_in_use_is_one_error_line(engine: Engine, app: App, db_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with worker_process(db_url, app.Task.__tablename__, port, "--burst") as proc:
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"Error: metrics: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
