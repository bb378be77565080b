"""The finished states' counts kept between status calls (status_summary.py).

Ranges of 4 ids here (not 65,536), so that a small table spans many: every
call's counts are checked against the definitions' count in SQL
(test_inspect.counts_by_definition) through what changes finished
attempts or could look like it: workers finishing tasks in old ranges, a
cancellation, the rescue, a purge, deletions by hand, the throughput
window; and the statements a repeated call runs are checked to be the
newest ranges' only.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, insert, inspect, select, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, status_summary
from sqla_queue.adapters.inspection import InspectionQueries
from sqla_queue.common.types import utcnow
from sqla_queue.ops.status import queue_status
from sqla_queue.testing import run_until_empty
from tests.integration.test_inspect import build_history, counts_by_definition
from tests.support.app import App


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(status_summary, "CHUNK_IDS", 4)
    status_summary.forget_all()
    yield
    status_summary.forget_all()


@pytest.fixture
def ranges_read(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The id ranges each finished-states statement reads, in order."""
    read: list[tuple[int, int]] = []
    original = InspectionQueries.closed_range

    def spy(self: InspectionQueries, conn: Any, **kwargs: Any) -> list[Any]:
        read.append((kwargs["low"], kwargs["high"]))
        return original(self, conn, **kwargs)

    monkeypatch.setattr(InspectionQueries, "closed_range", spy)
    return read


def processes(engine: Engine, app: App, **kwargs: Any) -> dict[str, dict[str, int]]:
    return dict(queue_status(engine, app.Task, **kwargs).as_json()["processes"])


def same_as_definition(engine: Engine, app: App, **kwargs: Any) -> None:
    """The status's counts are the definitions'; ``now`` by default ten
    minutes ahead, past the throughput window, so that a range is reused
    unless something else makes it be counted again."""
    kwargs.setdefault("now", utcnow() + dt.timedelta(minutes=10))
    assert processes(engine, app, **kwargs) == counts_by_definition(engine, app.Task.__table__)


def run_forty(engine: Engine, app: App, process: str = "p") -> None:
    """40 tasks of ``process`` enqueued and run: 10 ranges of finished attempts."""
    with Session(engine) as session:
        session.add_all([app.Task(process=process, payload={"n": n}) for n in range(40)])
        session.commit()
    with Session(engine) as session:
        run_until_empty(app.RecordingWorker, session)
        session.commit()


def test_kept_counts_follow_every_change_of_the_finished_attempts(
    engine: Engine, app: App, installed: None
) -> None:
    ids = build_history(engine, app)
    same_as_definition(engine, app)  # the first call counts every range
    same_as_definition(engine, app)  # the second reuses the old ones
    # the oldest ready task (in an old range by now) cancelled, then more
    # tasks enqueued and all ready ones run
    with Session(engine) as session:
        session.add_all([app.Task(process="faturar", payload={"n": n}) for n in range(12)])
        session.commit()
    same_as_definition(engine, app)
    with Session(engine) as session:
        QueueClient(session, app.Task).cancel(ids["requeued"])
        session.commit()
    same_as_definition(engine, app)

    class Everything(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"faturar", "relatorio"})

    with Session(engine) as session:
        run_until_empty(Everything, session)
        session.commit()
    same_as_definition(engine, app)
    # the scheduled task (id in the first ranges) made due and run
    with Session(engine) as session:
        QueueClient(session, app.Task).retry_now(ids["later"])
        session.commit()
    with Session(engine) as session:
        run_until_empty(Everything, session)
        session.commit()
    same_as_definition(engine, app)


def test_deletions_show_at_once_from_below_and_within_the_stale_bound_elsewhere(
    engine: Engine, app: App, installed: None
) -> None:
    run_forty(engine, app)
    # later than the throughput window's reach: no range is counted for it
    now = utcnow() + dt.timedelta(minutes=10)
    same_as_definition(engine, app, now=now)
    task = app.Task.__table__
    with engine.begin() as conn:
        low = conn.execute(select(func.min(task.c.id))).scalar_one()
        # a purge from below: the first ranges' rows gone
        conn.execute(delete(task).where(task.c.id < low + 6))
    same_as_definition(engine, app, now=now)
    # rows deleted by hand in the middle: no trace the cheap checks see...
    with engine.begin() as conn:
        conn.execute(delete(task).where(task.c.id.between(low + 13, low + 14)))
    stale = processes(engine, app, now=now)
    assert stale["p"]["succeeded"] == 34 == counts_by_definition(engine, task)["p"]["succeeded"] + 2
    # ...until asked for exact counts, or the range is older than STALE_SECONDS
    same_as_definition(engine, app, now=now, exact=True)
    with engine.begin() as conn:
        conn.execute(delete(task).where(task.c.id == low + 20))
    later = now + dt.timedelta(seconds=status_summary.STALE_SECONDS + 1)
    calls = 0
    while processes(engine, app, now=later) != counts_by_definition(engine, task):
        calls += 1  # STALE_PER_CALL ranges a call
        assert calls <= 40 // 4 // status_summary.STALE_PER_CALL + 1


def test_a_repeated_call_reads_only_the_newest_ranges(
    engine: Engine, app: App, installed: None, ranges_read: list[tuple[int, int]]
) -> None:
    run_forty(engine, app)
    with engine.connect() as conn:
        low, high = conn.execute(select(func.min(app.Task.id), func.max(app.Task.id))).one()
    now = utcnow() + dt.timedelta(minutes=10)
    queue_status(engine, app.Task, now=now)
    assert ranges_read == [(low, high)]  # the first call: one pass
    ranges_read.clear()
    queue_status(engine, app.Task, now=now)
    # the next: only the two newest ranges (where new ids land)
    [(start, end)] = ranges_read
    assert end == high and start == max(low, (high // 4 - 1) * 4)
    # a throughput window reaching back to when they finished: every range
    # must be counted again (each finished a row in it): one pass
    ranges_read.clear()
    status = queue_status(engine, app.Task, now=now, window_seconds=3600)
    assert status.throughput.finished == 40
    assert ranges_read == [(low, high)]
    # one range changed (a task enqueued long ago, now finished): that range
    # and the newest two
    with engine.begin() as conn:
        conn.execute(update(app.Task).where(app.Task.id == low + 5).values(status="pendente"))
    queue_status(engine, app.Task, now=now)  # counts it as open
    with Session(engine) as session:
        run_until_empty(app.RecordingWorker, session)
        session.commit()
    ranges_read.clear()
    queue_status(engine, app.Task, now=now)
    changed = (low + 5) // 4 * 4
    assert ranges_read[0] == (changed, changed + 3) and len(ranges_read) == 2


def test_a_new_process_reads_the_kept_counts_from_the_status_table(
    engine: Engine, app: App, installed: None, ranges_read: list[tuple[int, int]]
) -> None:
    """The counts are kept in <table>_status too: a process's first call
    (here: the memory dropped, as in a new process) reads only the ranges
    that may have changed, and counts right."""
    assert inspect(engine).has_table(f"{app.Task.__tablename__}_status")
    build_history(engine, app)
    with Session(engine) as session:
        session.add_all([app.Task(process="faturar", payload={"n": n}) for n in range(30)])
        session.commit()
    with Session(engine) as session:
        run_until_empty(app.RecordingWorker, session)
        session.commit()
    same_as_definition(engine, app)
    status_summary.forget_all()  # a new process
    ranges_read.clear()
    same_as_definition(engine, app)
    with engine.connect() as conn:
        low, high = conn.execute(select(func.min(app.Task.id), func.max(app.Task.id))).one()
    # the newest two ranges only (the kept ones' open counts did not change),
    # not a pass from the first id
    [(start, end)] = ranges_read
    assert end == high and start == max(low, (high // 4 - 1) * 4) > low
    # a task finishes in a kept range: counted right by a new process too
    with Session(engine) as session:
        QueueClient(session, app.Task).retry_now(
            session.scalar(select(app.Task.id).where(app.Task.status == "agendada"))
        )
        session.commit()

    class Everything(app.RecordingWorker):  # type: ignore[name-defined,misc]
        processes = frozenset({"relatorio", "backoff"})

    with Session(engine) as session:
        run_until_empty(Everything, session)
        session.commit()
    status_summary.forget_all()
    same_as_definition(engine, app)


def test_counts_kept_by_the_version_before_cancelled_are_counted_again(
    engine: Engine, app: App, installed: None, ranges_read: list[tuple[int, int]]
) -> None:
    """<table>_status as the version before ``cancelled`` left it (its
    groups without the cancelled field, a cancellation counted as failed,
    the covered row's format 0), and a range of it since purged: a new
    process counts everything again, counts right, and rewrites the table
    in its own format, the old range gone."""
    build_history(engine, app)  # a cancellation among its tasks
    same_as_definition(engine, app)
    store = status_summary.status_table(app.Task.__table__)
    with engine.begin() as conn:
        for range_id, groups in conn.execute(select(store.c.range_id, store.c.groups_json)):
            old = [[*group[:6], group[7]] for group in json.loads(groups)]
            conn.execute(
                update(store)
                .where(store.c.range_id == range_id)
                .values(groups_json=json.dumps(old))
            )
        conn.execute(update(store).where(store.c.range_id == -1).values(open_count=0))
        conn.execute(
            insert(store).values(
                range_id=99_999,
                open_count=0,
                counted_at=0.0,
                groups_json='[["p", null, "falha", 0, 0, 1, 5]]',
            )
        )
    status_summary.forget_all()  # a new process
    ranges_read.clear()
    same_as_definition(engine, app)
    with engine.connect() as conn:
        low, high = conn.execute(select(func.min(app.Task.id), func.max(app.Task.id))).one()
        kept = dict(conn.execute(select(store.c.range_id, store.c.open_count)).all())
    assert ranges_read == [(low, high)]  # one pass over everything
    assert kept[-1] == 1 and 99_999 not in kept
    # and the next new process reads what this one kept
    status_summary.forget_all()
    ranges_read.clear()
    same_as_definition(engine, app)
    assert ranges_read and ranges_read[0][0] > low


def test_without_the_status_table_every_new_process_counts_everything(
    db_url: str, table_name: str, ranges_read: list[tuple[int, int]]
) -> None:
    from sqlalchemy.orm import DeclarativeBase

    from sqla_queue import QueueMixin
    from tests.conftest import created_engine

    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table_name
        __queue_status_table__ = False

    assert f"{table_name}_status" not in Base.metadata.tables
    with created_engine(db_url, Base.metadata) as engine:
        with engine.begin() as conn:
            QueueClient(conn, Task).insert_tasks([{"processo": "p", "payload": {}}] * 9)
        queue_status(engine, Task)
        status_summary.forget_all()
        ranges_read.clear()
        assert queue_status(engine, Task).as_json()["totals"]["ready"] == 9
        with engine.connect() as conn:
            low, high = conn.execute(select(func.min(Task.id), func.max(Task.id))).one()
        assert ranges_read == [(low, high)]  # one pass over everything


def test_status_calls_from_several_threads_at_once_count_right(
    engine: Engine, app: App, installed: None
) -> None:
    """The dashboard answers requests in threads, and several processes
    write <table>_status: calls at once, each as a new process (memory
    dropped) or not, never fail and always count right."""
    import threading

    run_forty(engine, app)
    expected = counts_by_definition(engine, app.Task.__table__)
    errors: list[BaseException] = []
    results: list[dict[str, Any]] = []

    def call(n: int) -> None:
        try:
            for i in range(6):
                if (n + i) % 3 == 0:
                    status_summary.forget_all()
                results.append(processes(engine, app, now=utcnow() + dt.timedelta(minutes=10)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(results) == 24 and all(result == expected for result in results)
