"""Workflows past chains and groups (docs/workflows.md): ``step.after(*parents)``
for any DAG, the async client's ``enqueue_workflow``, ``parent_results()``
in an async handler, and the operator's view (``status --workflow
--watch``, the dashboard's links between a task and its workflow), on
SQLite, PostgreSQL and MariaDB (the ``engine`` fixture)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from sqla_queue import AsyncQueueClient, InvalidTaskError, QueueClient, WorkerBase, chain, group
from sqla_queue.common.exceptions import ConfigurationError
from sqla_queue.config.settings import Settings
from sqla_queue.ops.workflow_view import workflow_status
from sqla_queue.schema.mixins import workflow_tables
from sqla_queue.worker.aio import AsyncRunner
from tests.conftest import ROOT, wait_until
from tests.integration.test_worker import drain, tasks
from tests.integration.test_workflows import Seen, enqueue_flow, flow_worker, ran, step
from tests.support.app import App, build

WORKER = "tests.support.app:RecordingWorker"


def parents_of(engine: Engine, app: App, workflow_id: int) -> dict[int, list[int]]:
    """Each step's parents, in their order, as the operator's view reads them."""
    return {s.id: list(s.parents) for s in workflow_status(engine, app.Task, workflow_id).steps}


def stored(engine: Engine, app: App) -> list[int]:
    """The rows of the queue table and of its two workflow tables."""
    tables = workflow_tables(app.Task.__table__)
    with engine.connect() as conn:
        return [
            int(conn.execute(select(func.count()).select_from(table)).scalar_one())
            for table in (app.Task.__table__, tables.steps, tables.edges)
        ]


# --------------------------------------------------------------------- after()
def test_a_diamond_written_with_after_runs_each_step_once_after_its_parents(
    engine: Engine, app: App, installed: None, observer: Engine
) -> None:
    seen = Seen()
    a = step(app, "a", value={"from": "a"})
    b = step(app, "b").after(a)
    c = step(app, "c").after(a)
    d = step(app, "d", check=True).after(b, c)
    workflow_id = enqueue_flow(engine, group(a, b, c, d))

    assert workflow_id == a.id
    assert parents_of(engine, app, workflow_id) == {
        a.id: [],
        b.id: [a.id],
        c.id: [a.id],
        d.id: [b.id, c.id],
    }
    drain(flow_worker(app, seen, observer), engine, concurrency=3)

    done = ran(engine, app)
    assert sorted(done) == ["a", "b", "c", "d"]  # each once
    assert done[0] == "a" and done[-1] == "d"
    assert seen.others_committed == [True]  # d started after b and c committed
    assert seen.parents == {"a": [], "b": [{"from": "a"}], "c": [{"from": "a"}], "d": ["b", "c"]}


def test_a_dag_no_chain_or_group_can_express_comes_in_with_the_task_that_needs_it(
    engine: Engine, app: App, installed: None
) -> None:
    """a -> c, b -> c, b -> d: enqueuing c and d brings their after()
    parents, and the parents come first (the workflow's id is a root's)."""
    seen = Seen()
    a, b = step(app, "a"), step(app, "b")
    c = step(app, "c").after(a, b)
    d = step(app, "d").after(b)
    workflow_id = enqueue_flow(engine, group(c, d))

    assert workflow_id == min(t.id for t in (a, b, c, d)) == a.id
    assert [t.id for t in (a, b)] < [t.id for t in (c, d)]
    assert parents_of(engine, app, workflow_id) == {
        a.id: [],
        b.id: [],
        c.id: [a.id, b.id],
        d.id: [b.id],
    }
    assert [(t.status, t.run_at is None) for t in tasks(engine, app)] == [
        ("pendente", False),
        ("pendente", False),
        ("agendada", True),
        ("agendada", True),
    ]
    drain(flow_worker(app, seen), engine)

    order = {name: at for at, name in enumerate(ran(engine, app))}
    assert sorted(order) == ["a", "b", "c", "d"]
    assert order["a"] < order["c"] and order["b"] < order["c"] and order["b"] < order["d"]
    assert (seen.parents["c"], seen.parents["d"]) == (["a", "b"], ["b"])


def test_after_parents_come_after_a_chains_or_groups_own_in_parent_results(
    engine: Engine, app: App, installed: None
) -> None:
    """A task in a chain with after() parents too reads the chain's parent
    first, then its after() parents in the order given; a group as a
    parent is its tasks, in its order."""
    seen = Seen()
    x, y, z = step(app, "x"), step(app, "y"), step(app, "z")
    g1, g2 = step(app, "g1"), step(app, "g2")
    last = step(app, "last").after(z, group(g1, g2), x)
    for task, priority in ((g2, 10), (g1, 90), (z, 50)):  # claimed g1, z, g2
        task.priority = priority
    enqueue_flow(engine, chain(x, y, last))

    drain(flow_worker(app, seen), engine)

    assert seen.parents["last"] == ["y", "z", "g1", "g2", "x"]
    assert seen.parents["y"] == ["x"]
    assert ran(engine, app)[-1] == "last"


def test_a_cycle_is_refused_naming_its_tasks_and_nothing_is_written(
    engine: Engine, app: App, installed: None
) -> None:
    a, b, c = (app.Task(process=name) for name in "abc")
    a.after(c)
    with Session(engine) as session:
        session.begin()
        with pytest.raises(InvalidTaskError) as refused:
            chain(a, b, c).enqueue(session)
        message = str(refused.value)
        assert message == (
            "a workflow's tasks wait for each other in a cycle: 1 ('a') -> 2 ('b') -> "
            "3 ('c') -> 1 ('a') (each task by its place in the workflow, from 1, and its "
            "process; after() made the cycle)"
        )
        assert (list(session.new), list(session.dirty)) == ([], [])  # the session unchanged
        session.add(step(app, "business"))  # and the transaction goes on
        session.commit()
    assert [t.payload["name"] for t in tasks(engine, app)] == ["business"]
    assert stored(engine, app) == [1, 0, 0]


def test_after_refuses_what_cannot_be_a_parent_in_one_line(
    engine: Engine, app: App, installed: None
) -> None:
    other = build(f"{app.Task.__tablename__}_other")
    with Session(engine, expire_on_commit=False) as session, session.begin():
        saved = step(app, "saved")
        session.add(saved)
    a, b = step(app, "a"), step(app, "b")
    table = app.Task.__tablename__
    refused = {
        "not a task": (lambda: a.after("b"), "chains or groups, not str"),
        "itself": (lambda: a.after(a), "a task cannot run after itself"),
        "its own chain": (lambda: a.after(chain(b, a)), "nor after a chain or group it is in"),
        "saved": (lambda: a.after(saved), "a task runs after new tasks, not saved ones"),
        "saved, in a group": (lambda: a.after(group(b, saved)), "not saved ones"),
        "another table": (
            lambda: a.after(other.Task(process="x")),
            f"a task runs after tasks of its own queue table {table}, not of {table}_other",
        ),
        "no parent": (lambda: a.after(), "after() needs a parent"),
        "a saved task": (lambda: saved.after(b), "after() is for a new task"),
    }
    for what, (call, expected) in refused.items():
        with pytest.raises(InvalidTaskError) as error:
            call()
        assert expected in str(error.value), what
        assert "\n" not in str(error.value), what
    twice = chain(a, step(app, "c").after(a))
    with Session(engine) as session, pytest.raises(InvalidTaskError, match="parent twice"):
        twice.enqueue(session)
    assert "_sqla_queue_after" not in a.__dict__  # nothing kept from the refusals
    assert stored(engine, app) == [1, 0, 0]


# --------------------------------------------------------------------- async
def test_the_async_client_enqueues_a_workflow_in_the_callers_transaction(
    engine: Engine, app: App, installed: None
) -> None:
    """AsyncQueueClient.enqueue_workflow, QueueClient.enqueue_workflow's
    twin: through the async driver (psycopg's async mode, asyncmy,
    aiosqlite), committed with the caller's business row or rolled back
    with it; on an AsyncConnection it says it needs a session."""
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

    from tests.integration.test_async_enqueue import run

    a = step(app, "a")
    b, c = step(app, "b").after(a), step(app, "c").after(a)
    rolled_back = [step(app, "r1"), step(app, "r2")]

    async def body(aengine: AsyncEngine) -> int:
        async with AsyncSession(aengine) as session:
            client = AsyncQueueClient(session, app.Task)
            await client.enqueue_workflow(chain(*rolled_back))
            await session.rollback()
        async with AsyncSession(aengine, expire_on_commit=False) as session, session.begin():
            session.add(app.Effect(task_id=0, chain_id=0, note="business"))
            workflow_id = await AsyncQueueClient(session, app.Task).enqueue_workflow(
                group(b, c).then(step(app, "d")), on_failure="continue"
            )
        async with aengine.connect() as conn:
            with pytest.raises(ConfigurationError, match="needs a client on a Session"):
                await AsyncQueueClient(conn, app.Task).enqueue_workflow(chain(step(app, "x")))
        return workflow_id

    workflow_id = run(engine, body)
    assert workflow_id == a.id
    found = workflow_status(engine, app.Task, workflow_id)
    assert (found.on_failure, len(found.steps)) == ("continue", 4)
    assert stored(engine, app)[:2] == [4, 4]  # tasks, steps (the edges: the release's)
    seen = Seen()
    drain(flow_worker(app, seen), engine)
    assert seen.parents["d"] == ["b", "c"]


def test_the_sync_client_enqueues_a_workflow_of_its_own_table_only(
    engine: Engine, app: App, installed: None
) -> None:
    other = build(f"{app.Task.__tablename__}_other")
    with Session(engine) as session, session.begin():
        client = QueueClient(session, app.Task.__tablename__)  # by name: the same table
        workflow_id = client.enqueue_workflow(chain(step(app, "a"), step(app, "b")))
        with pytest.raises(
            InvalidTaskError, match=f"enqueued by a client of {app.Task.__tablename__}"
        ):
            client.enqueue_workflow(chain(other.Task(process="x")))
    assert [s.state for s in workflow_status(engine, app.Task, workflow_id).steps] == [
        "ready",
        "waiting",
    ]


def test_an_async_handler_reads_its_parents_results(
    engine: Engine, app: App, installed: None
) -> None:
    """A chain of two steps run by an async worker: the second reads the
    first's result, both ways docs/workflows.md gives."""
    seen: dict[str, Any] = {}

    class AsyncFlow(WorkerBase):
        model = app.Task
        retry_interval_minutes = 0

        async def execute(self, payload: Any, task: Any, session: Any) -> Any:
            name = payload["name"]
            seen[name] = (
                await session.run_sync(lambda _: task.parent_results()),
                await task.parent_results_async(),
            )
            session.add(app.Effect(task_id=task.id, chain_id=task.chain_id, note=name))
            return {"from": name, "n": len(name)}

    enqueue_flow(engine, chain(step(app, "first"), step(app, "second")))
    runner = AsyncRunner.for_worker(AsyncFlow(), engine=engine, burst=True, settings=Settings())
    assert runner.run() == 0

    assert ran(engine, app) == ["first", "second"]
    assert seen == {"first": ([], []), "second": ([{"from": "first", "n": 5}],) * 2}


# --------------------------------------------------------------------- the operator
def _terminal_output(primary: int, into: list[bytes]) -> None:
    """What the terminal's other end is written, until it closes."""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the process exited
            return
        if not chunk:
            return
        into.append(chunk)


@pytest.mark.parametrize("shown_one", ["--workflow", "--task"])
def test_status_watch_refreshes_the_workflow_or_the_task_until_ctrl_c(
    engine: Engine, app: App, db_url: str, installed: None, shown_one: str
) -> None:
    """The real CLI on a terminal (a pty: rich redraws only there): the
    workflow's table (or its first step's timeline), then the same table
    again once a worker ran the workflow, and exit 0 on Ctrl-C (SIGINT)."""
    a = step(app, "a")
    b = step(app, "b").after(a)
    workflow_id = enqueue_flow(engine, group(a, b))
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 220, 0, 0))
    one = workflow_id if shown_one == "--workflow" else a.id
    command = ("status", WORKER, "--url", db_url, shown_one, str(one), "--watch")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqla_queue.cli", *command, "--interval", "0.5"],
        cwd=ROOT,
        env={**os.environ, "SQLA_QUEUE_TEST_TABLE": app.Task.__tablename__, "TERM": "xterm"},
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_terminal_output, args=(primary, chunks), daemon=True)
    reader.start()

    def shown() -> str:
        text = b"".join(chunks).decode("utf-8", "replace")
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)

    def drawn(state: str) -> bool:
        """The table's title says ``state`` (the title wraps at the table's width)."""
        if shown_one == "--workflow":
            title = (
                f"workflow {workflow_id} of {app.Task.__tablename__} (on failure: stop): {state};"
            )
        else:
            title = f"task {a.id}: chain {a.id} (faturar), {state}"
        return "".join(title.split()) in "".join(shown().split())

    try:
        first = "running" if shown_one == "--workflow" else "ready"
        wait_until(lambda: drawn(first), timeout=60, message="the first table")
        drain(flow_worker(app, Seen()), engine)
        wait_until(lambda: drawn("succeeded"), message="the table redrawn")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, shown()
    except AssertionError as exc:
        raise AssertionError(f"{exc}; exit {proc.poll()}; shown: {shown()[-3000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        os.close(primary)
    assert "Traceback" not in shown()


def test_the_task_page_links_to_its_workflow_and_the_workflow_page_to_its_tasks(
    engine: Engine, app: App, installed: None
) -> None:
    """The real dashboard, logged in: a step's page (any attempt's id, a
    retry's too) links to /workflows/ID, a task that is no step's page has
    no such link, and the workflow page links each step to /tasks/ID."""
    from tests.acceptance.test_dashboard import logged_in, serving

    seen = Seen()
    a = step(app, "a", fail_first=True)
    b = step(app, "b").after(a)
    workflow_id = enqueue_flow(engine, group(a, b))
    plain = step(app, "plain")
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(plain)
    drain(flow_worker(app, seen, max_retry=2), engine)
    retry = next(t.id for t in tasks(engine, app) if t.initial_id == a.id)
    link = f'A step of <a href="/workflows/{workflow_id}">workflow {workflow_id}</a>.'

    with serving(engine, app.Task) as base:
        web, _ = logged_in(base)
        for task_id in (a.id, retry, b.id):
            page = web.get(f"{base}/tasks/{task_id}", timeout=10)
            assert page.status_code == 200
            assert link in page.text, task_id
            # the API says it too
            found = web.get(f"{base}/api/tasks/{task_id}", timeout=10).json()
            assert found["workflow_id"] == workflow_id, task_id
        page = web.get(f"{base}/tasks/{plain.id}", timeout=10)
        assert page.status_code == 200 and 'id="workflow"' not in page.text
        assert web.get(f"{base}/api/tasks/{plain.id}", timeout=10).json()["workflow_id"] is None
        flow_page = web.get(f"{base}/workflows/{workflow_id}", timeout=10)
        for task_id in (a.id, b.id):
            assert f'<a href="/tasks/{task_id}">{task_id}</a>' in flow_page.text
        anonymous = requests.get(f"{base}/tasks/{a.id}", allow_redirects=False, timeout=10)
        assert anonymous.status_code == 303


def test_a_task_page_on_a_database_without_the_workflow_tables(
    engine: Engine, app: App, installed: None
) -> None:
    """A queue made before workflows: its task pages show, with no link."""
    from tests.acceptance.test_dashboard import logged_in, serving

    tables = workflow_tables(app.Task.__table__)
    plain = step(app, "plain")
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(plain)
    for table in (tables.edges, tables.steps):
        table.drop(engine)
    try:
        with serving(engine, app.Task) as base:
            web, _ = logged_in(base)
            page = web.get(f"{base}/tasks/{plain.id}", timeout=10)
            assert page.status_code == 200 and 'id="workflow"' not in page.text
    finally:  # the engine fixture drops every table of the metadata
        tables.steps.create(engine)
        tables.edges.create(engine)
