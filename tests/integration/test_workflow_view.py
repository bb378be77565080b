"""The operator's view of a workflow (issue 51): ``workflow_status`` and its
JSON, ``sqla-queue status --workflow ID`` (a subprocess), the SVG graph and
the dashboard's ``/workflows/ID`` and ``/api/workflows/ID`` handlers, on
SQLite, PostgreSQL and MariaDB (the ``engine`` fixture). Workflows are
enqueued with the public API and run by a burst worker in-process."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import requests
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, chain, group
from sqla_queue.ops.workflow_view import COLLAPSE_OVER, workflow_status, workflow_svg
from tests.conftest import run_cli
from tests.integration.test_worker import drain
from tests.integration.test_workflows import Seen, flow_worker, step
from tests.support.app import App

WORKER = "tests.support.app:RecordingWorker"
SVG = "{http://www.w3.org/2000/svg}"


def enqueue_flow(engine: Engine, flow: Any, **options: Any) -> int:
    """Enqueue ``flow`` and commit; its tasks keep their ids (not expired)."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return int(flow.enqueue(session, **options))


def states(engine: Engine, app: App, workflow_id: int) -> dict[int, str]:
    """Each step's state, by step id."""
    found = workflow_status(engine, app.Task, workflow_id)
    return {s["id"]: s["state"] for s in found.as_dict()["steps"]}


def diamond(app: App, **payloads: dict[str, Any]) -> tuple[Any, ...]:
    """The tasks of chain(a, group(b, c), d), unsaved."""
    return tuple(step(app, name, **payloads.get(name, {})) for name in "abcd")


def contract(data: dict[str, Any]) -> tuple[int, str, list[int], list[int]]:
    """(workflow, state, ready steps, waiting steps) of the --json shape."""
    steps = [(s["id"], s["state"]) for s in data["steps"]]
    return (
        data["workflow"],
        data["state"],
        [i for i, state in steps if state == "ready"],
        [i for i, state in steps if state == "waiting"],
    )


def svg_tree(text: str) -> ET.Element:
    """The SVG parsed as XML (raises on anything not well-formed)."""
    return ET.fromstring(text)


# ----------------------------------------------------------------- states
def test_a_new_workflow_shows_its_first_step_ready_and_the_others_waiting(
    engine: Engine, app: App, installed: None
) -> None:
    a, b, c, d = diamond(app)
    workflow_id = enqueue_flow(engine, chain(a, group(b, c), d))

    found = workflow_status(engine, app.Task, workflow_id).as_dict()

    assert contract(found) == (workflow_id, "running", [a.id], [b.id, c.id, d.id])
    by_id = {s["id"]: s for s in found["steps"]}
    assert [by_id[t.id]["parents"] for t in (a, b, c, d)] == [[], [a.id], [a.id], [b.id, c.id]]
    assert [by_id[t.id]["depth"] for t in (a, b, c, d)] == [0, 1, 1, 2]
    assert {s["process"] for s in found["steps"]} == {"faturar"}
    assert found["counts"] == {"waiting": 3, "ready": 1}
    json.dumps(found)  # the contract's JSON, as --json prints it


def test_a_running_step_shows_running_and_a_finished_workflow_succeeded(
    engine: Engine, app: App, installed: None, observer: Engine
) -> None:
    """A step's handler reads the workflow on another connection: itself
    running, its parent succeeded, its child waiting."""
    seen = Seen()
    a, b, c, d = diamond(app, a={"value": {"token": "s3cr3t", "n": 1}})
    workflow_id = enqueue_flow(engine, chain(a, group(b, c), d))
    during: list[dict[int, str]] = []

    class Watching(flow_worker(app, seen)):  # type: ignore[misc]
        def execute(self, payload: Any, task: Any, session: Session) -> Any:
            if payload["name"] == "b":
                during.append(states(observer, app, workflow_id))
            return super().execute(payload, task, session)

    drain(Watching, engine)

    [seen_by_b] = during
    assert (seen_by_b[a.id], seen_by_b[b.id], seen_by_b[d.id]) == (
        "succeeded",
        "running",
        "waiting",
    )
    found = workflow_status(engine, app.Task, workflow_id)
    assert found.state == "succeeded"
    assert [s.state for s in found.steps] == ["succeeded"] * 4
    by_id = {s["id"]: s for s in found.as_dict()["steps"]}
    # every step keeps its result (the last one's is the workflow's); its
    # secrets are masked in the view
    assert by_id[a.id]["result"] == {"token": "***", "n": 1}
    assert by_id[d.id]["result"] == "d"


def test_a_dead_step_under_stop_then_its_requeue(engine: Engine, app: App, installed: None) -> None:
    """The dead step is dead_letter, the steps after it cancelled, the
    workflow dead_letter; requeued, the step is ready again, and
    dead_letter again once its requeued chain dies."""
    seen = Seen()
    a, bad, good, after = (
        step(app, "a"),
        step(app, "bad", fail=True),
        step(app, "good"),
        step(app, "after"),
    )
    workflow_id = enqueue_flow(engine, chain(a, group(bad, good), after))

    drain(flow_worker(app, seen, max_retry=2), engine)

    found = workflow_status(engine, app.Task, workflow_id)
    assert found.state == "dead_letter"
    assert states(engine, app, workflow_id) == {
        a.id: "succeeded",
        bad.id: "dead_letter",
        good.id: "succeeded",
        after.id: "cancelled",
    }
    with Session(engine) as session, session.begin():
        [requeued] = QueueClient(session, app.Task).requeue_dead([bad.id])
    again = {s.id: s for s in workflow_status(engine, app.Task, workflow_id).steps}
    assert (again[bad.id].state, again[bad.id].task_id) == ("ready", requeued.new_id)
    assert again[after.id].state == "waiting"  # the requeue resumes the workflow
    assert workflow_status(engine, app.Task, workflow_id).state == "running"
    # the requeued chain dies too: its dead-letter run names it, not the step
    drain(flow_worker(app, seen, max_retry=2), engine)
    assert states(engine, app, workflow_id)[bad.id] == "dead_letter"


def test_a_cancelled_workflow_shows_every_step_cancelled(
    engine: Engine, app: App, installed: None
) -> None:
    a, b, c, _ = diamond(app)
    workflow_id = enqueue_flow(engine, chain(a, group(b, c)))
    with Session(engine) as session, session.begin():
        QueueClient(session, app.Task).cancel_workflow(workflow_id)

    found = workflow_status(engine, app.Task, workflow_id)

    assert found.state == "cancelled"
    assert [s.state for s in found.steps] == ["cancelled"] * 3


# ----------------------------------------------------------------- the CLI
def test_status_workflow_prints_the_contracts_json_and_a_table(
    engine: Engine, app: App, db_url: str, installed: None
) -> None:
    a, b, c, d = diamond(app)
    workflow_id = enqueue_flow(engine, chain(a, group(b, c), d))
    env = {"SQLA_QUEUE_TEST_TABLE": app.Task.__tablename__}
    base = ("status", WORKER, "--url", db_url, "--workflow", str(workflow_id))

    data = json.loads(run_cli(*base, "--json", env=env).stdout)

    assert contract(data) == (workflow_id, "running", [a.id], [b.id, c.id, d.id])
    assert len(data["steps"]) == 4
    shown = run_cli(*base, env=env).stdout
    assert f"workflow {workflow_id} of {app.Task.__tablename__}" in shown
    assert f"{b.id}, {c.id}" in shown  # d's parents
    assert shown.count("waiting") >= 3
    missing = run_cli(
        "status", WORKER, "--url", db_url, "--workflow", str(d.id + 1000), env=env, check=False
    )
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"Error: no workflow {d.id + 1000} in {app.Task.__tablename__}"
    )


def test_a_workflow_id_out_of_range_is_a_usage_error_before_any_connection() -> None:
    from click.testing import CliRunner

    from sqla_queue.cli import main

    for value in ("0", "-1", "9223372036854775808", "1e3", "x"):
        result = CliRunner().invoke(main, ["status", WORKER, "--workflow", value])
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--workflow'" in result.stderr
    both = CliRunner().invoke(main, ["status", WORKER, "--workflow", "1", "--task", "1"])
    assert both.exit_code == 2
    assert "--workflow goes without --task" in both.stderr


# ----------------------------------------------------------------- the graph
def test_the_graph_has_a_box_per_step_and_an_arrow_per_edge(
    engine: Engine, app: App, installed: None
) -> None:
    hostile = '<script>alert("x")</script>&\x1b[31m\u202e'
    a, b, c, d = diamond(app)
    c.process = hostile
    workflow_id = enqueue_flow(engine, chain(a, group(b, c), d))

    svg = svg_tree(workflow_svg(workflow_status(engine, app.Task, workflow_id)))

    boxes = svg.findall(f".//{SVG}g[@class='step']")
    assert sorted(int(box.get("data-step", "0")) for box in boxes) == [a.id, b.id, c.id, d.id]
    assert {box.get("data-step"): box.get("data-state") for box in boxes}[str(d.id)] == "waiting"
    assert len(svg.findall(f".//{SVG}line[@class='edge']")) == 4
    assert svg.findall(f".//{SVG}script") == []
    texts = " ".join(t.text or "" for t in svg.iter(f"{SVG}title"))
    assert '<script>alert("x")</script>&\\x1b[31m\\u202e' in texts


def test_a_group_of_50_is_one_box_with_its_counts(
    engine: Engine, app: App, installed: None
) -> None:
    top, bottom = step(app, "top"), step(app, "bottom")
    middle = [step(app, f"m{i}") for i in range(50)]
    workflow_id = enqueue_flow(engine, chain(top, group(*middle), bottom))

    svg = svg_tree(workflow_svg(workflow_status(engine, app.Task, workflow_id)))

    assert COLLAPSE_OVER < 50
    [collapsed] = svg.findall(f".//{SVG}g[@class='collapsed']")
    assert collapsed.get("data-steps") == "50"
    words = [t.text for t in collapsed.iter(f"{SVG}text")]
    assert words == ["50 steps:", "50 waiting"]
    assert [box.get("data-step") for box in svg.findall(f".//{SVG}g[@class='step']")] == [
        str(top.id),
        str(bottom.id),
    ]
    assert len(svg.findall(f".//{SVG}line[@class='edge']")) == 2


# ----------------------------------------------------------------- the dashboard
def test_the_dashboards_workflow_page_and_api(engine: Engine, app: App, installed: None) -> None:
    """The handlers on a bare app: the page (the graph inline, the steps,
    every text escaped), the API (the --json shape), 404 for an unknown
    workflow and for an id no task can have. The login is the app's
    ``reader`` (wired in app.py)."""
    from jinja2 import DictLoader, Environment, select_autoescape
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.testclient import TestClient

    from sqla_queue.ops.dashboard.app import _task_id
    from sqla_queue.ops.dashboard.assets import TEMPLATES
    from sqla_queue.ops.dashboard.workflows import TEMPLATES as WORKFLOW_TEMPLATES
    from sqla_queue.ops.dashboard.workflows import workflow_routes

    env = Environment(
        loader=DictLoader({**TEMPLATES, **WORKFLOW_TEMPLATES}),
        autoescape=select_autoescape(default=True),
    )

    def page(request: Any, name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        html = env.get_template(name).render(queue="q", root="/r", read_only=True, **values)
        return HTMLResponse(html, status_code=status_code)

    def reader(handler: Any, *, api: bool = False) -> Any:
        return handler

    a, b, c, d = diamond(app)
    b.process = "<b>bold</b>"
    workflow_id = enqueue_flow(engine, chain(a, group(b, c), d))
    routes = workflow_routes(
        engine, app.Task.__table__, root="/r", page=page, reader=reader, parse_id=_task_id
    )
    client = TestClient(Starlette(routes=routes))

    shown = client.get(f"/workflows/{workflow_id}")
    assert shown.status_code == 200
    assert shown.text.count('<g class="step"') == 4
    assert f'<a href="/r/tasks/{b.id}">' in shown.text
    assert "<b>bold</b>" not in shown.text and "&lt;b&gt;bold&lt;/b&gt;" in shown.text
    assert '<span id="state">running</span>' in shown.text
    api = client.get(f"/api/workflows/{workflow_id}")
    assert api.json() == workflow_status(engine, app.Task, workflow_id).as_dict()
    assert client.get(f"/api/workflows/{d.id + 1000}").status_code == 404
    assert client.get(f"/api/workflows/{d.id + 1000}").json() == {
        "error": f"no workflow {d.id + 1000} in {app.Task.__tablename__}"
    }
    assert client.get("/workflows/9223372036854775808").status_code == 404
    assert client.get("/api/workflows/abc").status_code == 404


def test_the_real_dashboard_serves_a_workflow_only_behind_its_login(
    engine: Engine, app: App, installed: None
) -> None:
    """The routes as app.py wires them: logged out, the page sends to the
    login and the API answers 401; logged in, the graph and the JSON."""
    from tests.acceptance.test_dashboard import logged_in, serving

    a, b, c, d = diamond(app)
    workflow_id = enqueue_flow(engine, chain(a, group(b, c), d))
    with serving(engine, app.Task) as base:
        anonymous = requests.Session()
        page = anonymous.get(f"{base}/workflows/{workflow_id}", allow_redirects=False, timeout=10)
        assert (page.status_code, page.headers["location"]) == (303, "/login")
        assert anonymous.get(f"{base}/api/workflows/{workflow_id}", timeout=10).status_code == 401
        web, _ = logged_in(base)
        shown = web.get(f"{base}/workflows/{workflow_id}", timeout=10)
        assert shown.status_code == 200
        assert shown.text.count('<g class="step"') == 4
        api = web.get(f"{base}/api/workflows/{workflow_id}", timeout=10)
        assert api.json() == workflow_status(engine, app.Task, workflow_id).as_dict()
