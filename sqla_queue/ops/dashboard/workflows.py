# ruff: noqa: E501  (HTML, kept one element a line, as assets.py)
"""The dashboard's workflow pages (:mod:`sqla_queue.ops.workflow_view`):
``GET /workflows/ID``, the graph (an SVG drawn on the server, inline: no
script, no asset from elsewhere) and the steps' table, and ``GET
/api/workflows/ID``, what ``sqla-queue status --workflow ID --json``
prints. Both behind the login as every page (the app's ``reader``); an
id no workflow can have, or one the queue has not, answers 404.

The app adds them with its own page renderer and login guard::

    loader=DictLoader({**TEMPLATES, **WORKFLOW_TEMPLATES}),
    ...
    *workflow_routes(engine, table, root=config.root, page=page, reader=reader, parse_id=_task_id),
"""

from __future__ import annotations

from collections.abc import Callable

from markupsafe import Markup
from sqlalchemy import Engine, Table
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...common.exceptions import TaskNotFoundError
from ...config.ranges import TASK_ID
from ..workflow_view import WorkflowStatus, workflow_status, workflow_svg

__all__ = ["STEPS_SHOWN", "TEMPLATES", "workflow_routes"]

#: the steps the page's table lists at most (the API gives them all)
STEPS_SHOWN = 1_000

TEMPLATES = {
    "workflow.html": """{% extends "base.html" %}
{% block title %}workflow {{ workflow.workflow }}{% endblock %}
{% block main %}
<h2>Workflow {{ workflow.workflow }} (on failure: {{ workflow.on_failure }}): <span id="state">{{ workflow.state }}</span></h2>
<p id="counts">{{ workflow.steps|length }} steps: {% for state, n in workflow.counts().items() %}{{ n }} {{ state }}{% if not loop.last %}, {% endif %}{% endfor %}</p>
<div class="graph" id="graph">{{ graph }}</div>
<table id="steps">
<thead><tr><th>step</th><th>process</th><th>state</th><th>attempt</th><th>parents</th></tr></thead>
<tbody>
{% for s in steps %}
<tr data-step="{{ s.id }}" data-state="{{ s.state }}"><td><a href="{{ root }}/tasks/{{ s.id }}">{{ s.id }}</a></td><td>{{ s.process or "(none)" }}</td>
<td>{{ s.label }}</td><td>{{ s.attempt or "-" }}</td><td>{{ s.parents_shown() }}</td></tr>
{% endfor %}
</tbody>
</table>
{% if steps|length < workflow.steps|length %}<p id="more">The first {{ steps|length }} steps of {{ workflow.steps|length }}: <a href="{{ root }}/api/workflows/{{ workflow.workflow }}">/api/workflows/{{ workflow.workflow }}</a> has them all.</p>{% endif %}
{% endblock %}
""",
}

Page = Callable[..., Response]
Guard = Callable[..., Callable[[Request], Response]]


def workflow_routes(
    engine: Engine,
    table: Table,
    *,
    root: str,
    page: Page,
    reader: Guard,
    parse_id: Callable[[str], int | None],
) -> list[Route]:
    """The two routes on ``table``'s queue: ``page`` renders a template as
    the app's pages (``page(request, name, status_code, **values)``),
    ``reader`` guards a handler (``reader(handler, api=True)`` for the
    API), ``parse_id`` reads an id from a path (None: no task can have it),
    ``root`` prefixes the links."""

    def read(request: Request) -> WorkflowStatus | str:
        """The workflow the path names, or why there is none."""
        text = str(request.path_params["workflow_id"])
        workflow_id = parse_id(text)
        if workflow_id is None:
            shown = text if len(text) <= 40 else text[:40] + "…"
            return f"no workflow {shown}: a workflow id is {TASK_ID.describe()}"
        try:
            return workflow_status(engine, table, workflow_id)
        except TaskNotFoundError as exc:
            return str(exc)

    def workflow(request: Request) -> Response:
        found = read(request)
        if isinstance(found, str):
            return page(request, "error.html", 404, error=found)
        graph = workflow_svg(found, href=lambda step: f"{root}/tasks/{step}")
        return page(
            request,
            "workflow.html",
            workflow=found,
            # drawn by workflow_svg, every text in it escaped there
            graph=Markup(graph),
            steps=found.steps[:STEPS_SHOWN],
        )

    def api_workflow(request: Request) -> Response:
        found = read(request)
        if isinstance(found, str):
            return JSONResponse({"error": found}, status_code=404)
        return JSONResponse(found.as_dict())

    return [
        Route("/workflows/{workflow_id}", reader(workflow)),
        Route("/api/workflows/{workflow_id}", reader(api_workflow, api=True)),
    ]
