"""The web dashboard: Starlette (small, well kept, the ASGI toolkit FastAPI
is built on) served by uvicorn, pages from Jinja2 with autoescape on.

Every page and API call needs a login with the configured credential
(``SQLA_QUEUE_DASHBOARD_PASSWORD``, user ``admin`` or
``SQLA_QUEUE_DASHBOARD_USER``): a page sends a visitor who has not logged in
to ``/login``, an API call answers 401. In read-only mode
(``DashboardConfig.read_only``, ``--read-only``) reads need no login and
every write is refused with 403; without a password and without read-only
mode :func:`create_app` refuses to build the app. Sessions are kept on the
server (:mod:`.auth`): the cookie holds a random id only, is HttpOnly,
SameSite=Strict, and Secure under TLS or behind a TLS proxy; a logout
deletes the session; failed logins are throttled. Each write carries the
session's CSRF token (a form field, or the ``X-CSRF-Token`` header). A
request whose ``Host`` header is not on the allow-list gets 400 (DNS
rebinding). Every response says ``Content-Security-Policy: default-src
'none'`` plus this app's own script and stylesheet; task text is escaped
(markup as text, control and bidi characters as ``\\x1b``, ``\\u202e``);
webhook URLs are shown as ``sqla-queue status`` shows them (path and query
masked).

The JSON API (docs/operations.md, "The dashboard"): ``GET /api/status``
(what ``sqla-queue status --json`` prints), ``GET /api/tasks`` (the tasks,
newest first, by state, process, external key and id range, a page at a
time behind an opaque cursor), ``GET /api/tasks/ID`` (a task's timeline
and payload), ``GET /api/workers`` (the workers holding tasks), ``GET /api/history``
(attempts finished per minute, or per 15 minutes, and process: :mod:`.history`). Payloads
are shown with their secrets masked (``redact_json``). A bad query
parameter answers 400 with ``{"error": "..."}``, and so does a bulk
action's body of any other shape than documented (413 over 1 MB), before
any task is touched.
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

from jinja2 import DictLoader, Environment, select_autoescape
from markupsafe import Markup
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from ...adapters import adapter_of
from ...adapters.inspection import TASK_STATES, TaskPage, task_state
from ...client.pause import pause, resume
from ...client.queue import QueueClient, resolve_table
from ...common.exceptions import ConfigurationError, SqlaQueueError, TaskNotFoundError
from ...common.payload import decode_payload
from ...common.redaction import escape_controls, redact_json
from ...config.ranges import DEFAULT_LEASE_SECONDS, LEASE_SECONDS, TASK_ID, Range
from ...webhooks.guard import show_url
from ..status import (
    STATES,
    Timeline,
    dead_letter,
    describe_age,
    message_gloss,
    queue_status,
    recent_copies,
    task_timeline,
)
from ..workflow_view import workflow_of
from .assets import CSS, JS, TEMPLATES
from .auth import DashboardSession, LoginThrottle, SessionStore
from .history import WINDOWS, chart, finished_history
from .workflows import TEMPLATES as WORKFLOW_TEMPLATES
from .workflows import workflow_routes

__all__ = ["COOKIE", "LOCAL_HOSTS", "DashboardConfig", "allowed_hosts", "create_app"]

#: the session cookie's name
COOKIE = "sqla_queue_dashboard"
#: the Host header names always accepted (with any port)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")

_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
_NOTICES = {
    "requeue": "Requeued: the task runs again as a new chain.",
    "cancel": "Cancelled.",
    "retry-now": "Its next attempt is ready now.",
    "pause": "Paused: no worker claims its tasks (within 2 s).",
    "resume": "Resumed.",
    "logged-in": "Logged in.",
    "logged-out": "Logged out.",
}
_READ_ONLY = (
    "this dashboard is read-only (--read-only, SQLA_QUEUE_DASHBOARD_READ_ONLY): "
    "requeue, cancel, retry and pause are refused"
)
_NO_PASSWORD = (
    "the dashboard needs SQLA_QUEUE_DASHBOARD_PASSWORD (every page then needs a login), "
    "or --read-only (SQLA_QUEUE_DASHBOARD_READ_ONLY=true: no login, no writes)"
)
_BAD_CSRF = "CSRF token missing or wrong (reload the page)"
#: tasks a page of ``/api/tasks`` holds: ``limit``'s bounds and default
TASK_PAGE = Range(1, 500, integer=True)
DEFAULT_TASK_PAGE = 50
#: the most tasks one bulk action acts on (a filter matching more: the newest)
BULK_MAX = 1_000
#: the most pages of the task list a bulk action's filter reads
BULK_PAGES_MAX = 200
#: the largest body a bulk action keeps (1,000 ids take about 20 KB): a
#: larger one answers 413
BULK_BODY_MAX_BYTES = 1_048_576
#: a larger body is still read, unkept, up to this size (_capped_body)
_DRAINED_MAX_BYTES = 64 * 1_048_576
#: the actions on a task, one at a time or in bulk
TASK_ACTIONS = ("requeue", "cancel", "retry-now")
#: the keys of a bulk action's JSON filter (``/api/tasks``'s, but a page's)
BULK_FILTER_KEYS = ("state", "process", "external_key", "min_id", "max_id")


@dataclass(frozen=True)
class DashboardConfig:
    """What the dashboard shows, and to whom.

    ``password``: the credential (user ``user``) every page, API call and
    write needs. ``read_only``: reads need no login and every write is
    refused; without it ``password`` is required. ``allowed_hosts``: the
    ``Host`` header names accepted besides :data:`LOCAL_HOSTS`, with any
    port (``*.example.com`` for its subdomains, ``*`` for any). ``behind_tls_proxy``:
    the session cookie is Secure on plain HTTP too (a proxy in front speaks
    TLS); it is Secure anyway when the request came over HTTPS.
    ``secret_key``: obsolete, accepted and ignored (sessions are kept on
    the server; nothing is signed). ``lease_seconds``: the workers' lease
    (``lease_seconds``), to tell when a worker's heartbeat last renewed
    its leases (``/api/workers``)."""

    user: str = "admin"
    password: str | None = None
    secret_key: str | None = None
    root: str = ""
    window_seconds: float = 300.0
    read_only: bool = False
    allowed_hosts: tuple[str, ...] = ()
    behind_tls_proxy: bool = False
    lease_seconds: float = DEFAULT_LEASE_SECONDS

    def check(self) -> None:
        """Raises ConfigurationError without a password unless read-only,
        for a bad allowed host and for a lease out of range."""
        if not self.password and not self.read_only:
            raise ConfigurationError(_NO_PASSWORD)
        allowed_hosts(self.allowed_hosts)
        LEASE_SECONDS.check("lease_seconds", self.lease_seconds)


def create_app(
    engine: Engine,
    model: Any,
    *,
    subscriber_model: Any = None,
    config: DashboardConfig | None = None,
    periodic: Sequence[Any] = (),
    clock: Callable[[], float] = time.monotonic,
    worker: Any = None,
) -> Starlette:
    """The dashboard of ``model``'s queue table on ``engine``. ``clock``
    (seconds) times sessions and login lockouts; ``worker``, the worker
    class, names the limits the processes page shows (its
    ``concurrency_limits``, ``rate_limits``, ``fair_by``). Raises
    ConfigurationError as :meth:`DashboardConfig.check` does."""
    config = config or DashboardConfig()
    config.check()
    hosts = allowed_hosts(config.allowed_hosts)
    table = resolve_table(model)
    # the model, when given one: it names its configuration table
    queue: Any = model if isinstance(model, type) else table
    env = Environment(
        loader=DictLoader({**TEMPLATES, **WORKFLOW_TEMPLATES}),
        autoescape=select_autoescape(default=True),
        finalize=_visible,
    )
    env.globals.update(
        when=lambda at: "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S"),
        age=describe_age,
        mb=lambda n: f"{n / 1048576:.1f} MB",
        states=STATES,
        gloss=message_gloss,
    )
    sessions = SessionStore(clock)
    throttle = LoginThrottle(clock)

    def logged_in(request: Request) -> DashboardSession | None:
        session = sessions.get(request.cookies.get(COOKIE))
        return session if session is not None and session.user is not None else None

    def page(request: Request, name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        session: DashboardSession | None = getattr(request.state, "session", None)
        user = session.user if session is not None else None
        html = env.get_template(name).render(
            queue=table.name,
            root=config.root,
            user=user,
            csrf=session.csrf if session is not None else "",
            read_only=config.read_only,
            can_write=not config.read_only and user is not None,
            notice=_NOTICES.get(request.query_params.get("done", "")),
            **values,
        )
        return HTMLResponse(html, status_code=status_code)

    def reader(
        handler: Callable[[Request], Response], *, api: bool = False
    ) -> Callable[[Request], Response]:
        """``handler`` behind the login (unless read-only)."""

        def guarded(request: Request) -> Response:
            session = logged_in(request)
            if session is None and not config.read_only:
                if api:
                    return JSONResponse({"error": "log in first"}, status_code=401)
                return RedirectResponse(f"{config.root}/login", status_code=303)
            request.state.session = session
            return handler(request)

        return guarded

    def set_cookie(request: Request, response: Response, session: DashboardSession) -> None:
        response.set_cookie(
            COOKIE,
            session.id,
            max_age=int(session.expires - session.created),
            path="/",
            secure=_secure(request, config),
            httponly=True,
            samesite="strict",
        )

    def overview(request: Request) -> Response:
        window = request.query_params.get("window") or "hour"
        if window not in WINDOWS:
            return page(request, "error.html", 400, error=_bad_window(window))
        status = queue_status(
            engine, queue, window_seconds=config.window_seconds, periodic=periodic
        )
        data = status.as_json()
        oldest = status.oldest_ready_seconds
        history = finished_history(engine, table, window=window)
        return page(
            request,
            "overview.html",
            # the counts as dicts: the template indexes them by state name
            status=_StatusView(status, data),
            oldest="none" if oldest is None else describe_age(oldest),
            window=describe_age(config.window_seconds),
            windows=list(WINDOWS),
            history=history,
            chart=chart(history),
        )

    def chart_svg(request: Request) -> Response:
        window = request.query_params.get("window") or "hour"
        if window not in WINDOWS:
            return PlainTextResponse(_bad_window(window), status_code=400)
        history = finished_history(engine, table, window=window)
        svg = env.get_template("chart.svg").render(history=history, chart=chart(history))
        return Response(svg, media_type="image/svg+xml")

    def api_history(request: Request) -> Response:
        window = request.query_params.get("window") or "hour"
        if window not in WINDOWS:
            return JSONResponse({"error": _bad_window(window)}, status_code=400)
        return JSONResponse(finished_history(engine, table, window=window).as_json())

    def task_view(task_id: int) -> tuple[Timeline, Any, int | None]:
        """``task_id``'s timeline, its payload as the API gives it (decoded,
        its secrets masked: a retry's row may hold none, its chain's first
        attempt does) and its workflow's id (None: not a step), for its
        page and the API alike. Raises TaskNotFoundError."""
        timeline = task_timeline(engine, table, task_id)
        with engine.connect() as conn:
            adapter = adapter_of(engine.dialect, table, task_locks=False)
            stored = adapter.task_payloads(conn, ids=[task_id, timeline.chain_id])
        payload = _payload(stored.get(task_id) or stored.get(timeline.chain_id))
        return timeline, payload, workflow_of(engine, table, timeline.chain_id)

    def task(request: Request) -> Response:
        task_id = _task_id(request.path_params["task_id"])
        if task_id is None:
            return page(request, "error.html", 404, error=_no_task(request))
        try:
            timeline, payload, workflow_id = task_view(task_id)
        except TaskNotFoundError as exc:
            return page(request, "error.html", 404, error=str(exc))
        return page(
            request,
            "task.html",
            timeline=timeline,
            actions=_actions_for(timeline),
            payload=json.dumps(payload, ensure_ascii=False, indent=2),
            workflow_id=workflow_id,  # a workflow's step links to its workflow's page
        )

    def dead(request: Request) -> Response:
        return page(request, "dead.html", dead=dead_letter(engine, table, limit=100))

    def subscriptions(request: Request) -> Response:
        rows: list[dict[str, Any]] | None = None
        if subscriber_model is not None:
            adapter = adapter_of(engine.dialect, table)
            # never the headers or the signing secret; the URL's path and
            # query (which may hold keys) masked
            columns = ("id", "processo", "ativo", "url")
            with engine.connect() as conn:
                found = adapter.subscription_list_all(
                    conn, table=subscriber_model.__table__, columns=columns
                )
            rows = [
                {
                    "id": r["id"],
                    "process": r["processo"],
                    "active": r["ativo"],
                    "url": show_url(r["url"]) if r["url"] else None,
                }
                for r in found
            ]
        return page(
            request,
            "subscriptions.html",
            subscriptions=rows,
            copies=recent_copies(engine, table, limit=50),
        )

    def api_status(request: Request) -> Response:
        status = queue_status(
            engine, queue, window_seconds=config.window_seconds, periodic=periodic
        )
        return JSONResponse(status.as_json())

    def api_task(request: Request) -> Response:
        task_id = _task_id(request.path_params["task_id"])
        if task_id is None:
            return JSONResponse({"error": _no_task(request)}, status_code=404)
        try:
            timeline, payload, workflow_id = task_view(task_id)
        except TaskNotFoundError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse({**timeline.as_json(), "payload": payload, "workflow_id": workflow_id})

    def task_page(asked: dict[str, Any]) -> TaskPage:
        adapter = adapter_of(engine.dialect, table, task_locks=False)
        with engine.connect() as conn:
            return adapter.inspection.task_page(conn, **asked)

    def tasks(request: Request) -> Response:
        try:
            asked = _task_filters(request)
        except _BadQuery as exc:
            return page(request, "error.html", 400, error=str(exc))
        found = task_page(asked)
        next_url = None
        if found.before is not None:
            kept = {k: v for k, v in request.query_params.items() if v and k != "after"}
            next_url = f"{config.root}/tasks?{urlencode({**kept, 'after': found.before})}"
        shown = [
            {
                **_task_json(row),
                "payload": _payload_text(row.payload),
                # datetimes, for the pages' own format (when())
                "run_at": _utc(row.data_hora),
                "started_at": _utc(row.started_at),
                "finished_at": _utc(row.finished_at),
            }
            for row in found.rows
        ]
        return page(
            request,
            "tasks.html",
            tasks=shown,
            filters=asked,
            next_url=next_url,
            task_states=TASK_STATES,
            bulk_max=BULK_MAX,
        )

    def api_tasks(request: Request) -> Response:
        try:
            asked = _task_filters(request)
        except _BadQuery as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        found = task_page(asked)
        return JSONResponse(
            {
                "tasks": [_task_json(row) for row in found.rows],
                "next": None if found.before is None else str(found.before),
            }
        )

    def lease_holders() -> list[dict[str, Any]]:
        adapter = adapter_of(engine.dialect, table, task_locks=False)
        with engine.connect() as conn:
            holders = adapter.inspection.lease_holders(conn)
        lease = dt.timedelta(seconds=config.lease_seconds)
        return [
            {
                "worker_id": row.worker_id,
                "tasks": int(row.tasks),
                "last_heartbeat": _last_heartbeat(row, lease),
            }
            for row in holders
        ]

    def api_workers(request: Request) -> Response:
        shown = [{**w, "last_heartbeat": _iso(w["last_heartbeat"])} for w in lease_holders()]
        return JSONResponse({"workers": shown})

    def workers(request: Request) -> Response:
        now = dt.datetime.now(dt.timezone.utc)
        found = [
            {
                **w,
                "ago": None
                if w["last_heartbeat"] is None
                else describe_age(max(0.0, (now - w["last_heartbeat"]).total_seconds())),
            }
            for w in lease_holders()
        ]
        return page(request, "workers.html", workers=found)

    def processes(request: Request) -> Response:
        status = queue_status(
            engine, queue, window_seconds=config.window_seconds, periodic=periodic
        )
        data = status.as_json()
        shown = [
            {
                "name": name,
                "counts": counts,
                "paused": name in status.paused,
                "throughput": status.throughput_by_process.get(name),
                "limits": _limits_of(worker, name),
            }
            for name, counts in data["processes"].items()
        ]
        return page(
            request,
            "processes.html",
            processes=shown,
            fairness=_fairness_of(worker),
            window=describe_age(config.window_seconds),
        )

    async def write_action(request: Request, actions: Sequence[str]) -> str | Response:
        """The path's action, one of ``actions``, for a write that may go
        ahead; else the answer refusing it (refuse_write, then the action)."""
        refused = await refuse_write(request)
        if refused is not None:
            return refused
        action = request.path_params["action"]
        unknown = _unknown_action(request, action, actions)
        return action if unknown is None else unknown

    async def refuse_write(request: Request) -> Response | None:
        """Why a write is refused (read-only, no login, a bad CSRF token), or None."""
        if config.read_only:
            return _answer(request, 403, _READ_ONLY)
        session = logged_in(request)
        if session is None:
            return _answer(request, 401, "log in to act on tasks")
        given = request.headers.get("x-csrf-token")
        if given is None:
            try:
                form = await _form(request)
            except _BadQuery as exc:
                return _answer(request, exc.status, str(exc))
            given = form.get("csrf")  # type: ignore[assignment]
        if not _same(given, session.csrf):
            return _answer(request, 403, _BAD_CSRF)
        return None

    def apply(action: str, task_id: int) -> int:
        """``action`` on ``task_id`` in a transaction of its own: the task
        it leaves to look at (a requeue's new chain). Raises
        TaskNotFoundError, _Conflict or SqlaQueueError."""
        with engine.connect() as conn, conn.begin():
            client = QueueClient(conn, table)
            if action == "requeue":
                done = client.requeue_dead([task_id])
                if not done:
                    raise _Conflict(
                        f"task {task_id} is not a dead task, or it was requeued already"
                    )
                new_id = done[0].new_id
                return task_id if new_id is None else new_id
            if action == "cancel":
                client.cancel(task_id)
            else:
                client.retry_now(task_id)
            return task_id

    def matching(filters: dict[str, Any]) -> tuple[list[int], bool]:
        """The ids of the tasks ``filters`` (task_page's) match, newest first,
        up to :data:`BULK_MAX`; and whether more matched."""
        asked = {**filters, "limit": int(TASK_PAGE.high)}
        found: list[int] = []
        for _ in range(BULK_PAGES_MAX):
            got = task_page(asked)
            found += (row.id for row in got.rows)
            if len(found) > BULK_MAX:
                return found[:BULK_MAX], True
            if got.before is None:
                return found, False
            asked["before"] = got.before
        return found, True

    async def bulk(request: Request) -> Response:
        action = await write_action(request, TASK_ACTIONS)
        if isinstance(action, Response):
            return action
        try:
            ids, filters = await _bulk_request(request)
        except _BadQuery as exc:
            return _answer(request, exc.status, str(exc))
        more = False
        if filters is not None:
            ids, more = matching(filters)
        results: list[dict[str, Any]] = []
        for task_id in ids:
            try:
                results.append({"id": task_id, "outcome": "done", "task": apply(action, task_id)})
            except (TaskNotFoundError, _Conflict, SqlaQueueError) as exc:
                results.append({"id": task_id, "outcome": "refused", "error": str(exc)})
        done = sum(1 for r in results if r["outcome"] == "done")
        answer = {
            "action": action,
            "done": done,
            "refused": len(results) - done,
            "more": more,
            "results": results,
        }
        if _wants_json(request) or request.headers.get("content-type", "").startswith(
            "application/json"
        ):
            return JSONResponse(answer)
        return page(request, "bulk.html", bulk=answer, bound=BULK_MAX)

    async def act(request: Request) -> Response:
        action = await write_action(request, TASK_ACTIONS)
        if isinstance(action, Response):
            return action
        task_id = _task_id(request.path_params["task_id"])
        if task_id is None:
            return _answer(request, 404, _no_task(request))
        try:
            shown = apply(action, task_id)
        except TaskNotFoundError as exc:
            return _answer(request, 404, str(exc))
        except (_Conflict, SqlaQueueError) as exc:
            return _answer(request, 409, str(exc))
        if _wants_json(request):
            return JSONResponse({"ok": True, "action": action, "task": shown})
        return RedirectResponse(f"{config.root}/tasks/{shown}?done={action}", status_code=303)

    async def pausing(request: Request) -> Response:
        action = await write_action(request, ("pause", "resume"))
        if isinstance(action, Response):
            return action
        try:
            form = await _form(request)
        except _BadQuery as exc:
            return _answer(request, exc.status, str(exc))
        process = form.get("process")
        if not isinstance(process, str) or not process:
            return _answer(request, 400, "give the process to pause or resume")
        try:
            with engine.connect() as conn, conn.begin():
                change = pause if action == "pause" else resume
                paused = change(conn, queue, [process])
        except SqlaQueueError as exc:
            return _answer(request, 400, str(exc))
        if _wants_json(request):
            return JSONResponse({"ok": True, "paused": sorted(paused)})
        back = "/processes" if form.get("back") == "processes" else "/"
        return RedirectResponse(f"{config.root}{back}?done={action}", status_code=303)

    def login_page(request: Request) -> Response:
        if config.read_only:
            return page(request, "error.html", 403, error=_READ_ONLY)
        session = sessions.get(request.cookies.get(COOKIE))
        fresh = session is None
        if session is None:
            # anonymous: it carries the login form's CSRF token only
            session = sessions.start(None)
        request.state.session = session
        response = page(request, "login.html", error=None)
        if fresh:
            set_cookie(request, response, session)
        return response

    async def login(request: Request) -> Response:
        if config.read_only:
            return page(request, "error.html", 403, error=_READ_ONLY)
        form = await request.form()
        before = request.cookies.get(COOKIE)
        session = sessions.get(before)
        request.state.session = session
        if session is None or not _same(form.get("csrf"), session.csrf):
            return page(request, "error.html", 403, error=_BAD_CSRF)
        assert config.password is not None
        user, password = str(form.get("username", "")), str(form.get("password", ""))
        good_user = hmac.compare_digest(user.encode(), config.user.encode())
        good_password = hmac.compare_digest(password.encode(), config.password.encode())
        verdict = throttle.attempt(_client(request), good_user and good_password)
        if verdict.throttled:
            wait = math.ceil(verdict.retry_after_seconds)
            refused = page(
                request,
                "login.html",
                429,
                error=f"too many failed logins: try again in {wait} s",
            )
            refused.headers["Retry-After"] = str(wait)
            return refused
        if not verdict.ok:
            return page(request, "login.html", 401, error="wrong user or password")
        sessions.end(before)
        response = RedirectResponse(f"{config.root}/?done=logged-in", status_code=303)
        set_cookie(request, response, sessions.start(config.user))
        return response

    async def logout(request: Request) -> Response:
        form = await request.form()
        before = request.cookies.get(COOKIE)
        session = sessions.get(before)
        request.state.session = session
        if session is None or not _same(form.get("csrf"), session.csrf):
            return page(request, "error.html", 403, error=_BAD_CSRF)
        sessions.end(before)
        response = RedirectResponse(f"{config.root}/login?done=logged-out", status_code=303)
        response.delete_cookie(
            COOKIE, path="/", secure=_secure(request, config), httponly=True, samesite="strict"
        )
        return response

    def css(request: Request) -> Response:
        return Response(CSS, media_type="text/css")

    def js(request: Request) -> Response:
        return Response(JS, media_type="text/javascript")

    routes = [
        Route("/", reader(overview)),
        Route("/tasks", reader(tasks)),
        Route("/tasks/{task_id}", reader(task)),
        Route("/workers", reader(workers)),
        Route("/processes", reader(processes)),
        Route("/dead", reader(dead)),
        Route("/subscriptions", reader(subscriptions)),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/status", reader(api_status, api=True)),
        Route("/api/tasks", reader(api_tasks, api=True)),
        Route("/api/tasks/{task_id}", reader(api_task, api=True)),
        Route("/api/workers", reader(api_workers, api=True)),
        Route("/api/history", reader(api_history, api=True)),
        Route("/chart.svg", reader(chart_svg, api=True)),
        Route("/api/tasks/bulk/{action}", bulk, methods=["POST"]),
        Route("/api/tasks/{task_id}/{action}", act, methods=["POST"]),
        Route("/api/processes/{action}", pausing, methods=["POST"]),
        Route("/static/app.css", css),
        Route("/static/app.js", js),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        *workflow_routes(
            engine, table, root=config.root, page=page, reader=reader, parse_id=_task_id
        ),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
        ],
    )


def allowed_hosts(extra: Iterable[str]) -> list[str]:
    """:data:`LOCAL_HOSTS` and the ``extra`` names, as the ``Host`` check
    compares them (lower case, no port, IPv6 in brackets). A bad name is a
    ConfigurationError."""
    hosts = list(LOCAL_HOSTS)
    for text in extra:
        host = _host_name(text)
        if host not in hosts:
            hosts.append(host)
    return hosts


def _host_name(text: str) -> str:
    value = text.strip().lower()
    bad = ConfigurationError(
        f"allowed host {text!r} is not a host name: give a name (dash.example.com), "
        "*.example.com, an IP address or *"
    )
    if not value or any(c.isspace() or c in "/@?#\\," for c in value):
        raise bad
    if value.startswith("["):  # [::1] or [::1]:8780
        inside, closed, port = value[1:].partition("]")
        if not closed or (port and not re.fullmatch(r":\d{1,5}", port)):
            raise bad
        value = inside
    elif "[" in value or "]" in value:
        raise bad
    elif value.count(":") == 1:  # name:port
        value, _, port = value.partition(":")
        if not port.isdigit():
            raise bad
    if ":" in value:
        try:
            return f"[{ipaddress.IPv6Address(value)}]"
        except ValueError:
            raise bad from None
    if value != "*" and ("*" in value[1:] or (value.startswith("*") and value[:2] != "*.")):
        raise bad
    return value


def _secure(request: Request, config: DashboardConfig) -> bool:
    return config.behind_tls_proxy or request.url.scheme == "https"


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def _task_id(text: str) -> int | None:
    """The task id in a path; None for one no task can have (beyond BIGINT,
    0, not a number): those answer 404 without a query, on every database."""
    if not text.isascii() or not text.isdigit() or len(text) > 25:
        return None
    task_id = int(text)
    return task_id if TASK_ID.contains(task_id) else None


def _no_task(request: Request) -> str:
    text = str(request.path_params["task_id"])
    shown = text if len(text) <= 40 else text[:40] + "…"
    return f"no task {shown}: a task id is {TASK_ID.describe()}"


def _bad_window(window: str) -> str:
    return f"unknown window '{_shown(window)}': one of {', '.join(WINDOWS)}"


class _BadQuery(ValueError):
    """A query parameter or a body no answer can be given for (400)."""

    status = 400


class _TooLarge(_BadQuery):
    """A body over :data:`BULK_BODY_MAX_BYTES` (413)."""

    status = 413


def _task_filters(request: Request) -> dict[str, Any]:
    """``task_page``'s arguments from ``/api/tasks``'s query parameters
    (state, process, external_key, min_id, max_id, limit, after); raises
    _BadQuery for a bad one."""
    return _filters_of(request.query_params)


async def _form(request: Request) -> FormData:
    """The request's form. One python-multipart refuses (more than 1,000
    fields, a field over 1 MB, a broken multipart body) raises _BadQuery:
    Starlette would answer it in plain text."""
    try:
        return await request.form()
    except HTTPException as exc:
        raise _BadQuery(f"the form cannot be read: {exc.detail}") from None


async def _bulk_request(request: Request) -> tuple[list[int], dict[str, Any] | None]:
    """A bulk action's tasks: ``{"ids": [...]}`` or ``{"filter": {...}}``
    (``/api/tasks``'s parameters) as JSON, or a form's ``ids`` fields, or
    its filter fields with ``everything`` set. (ids, None) or ([], the
    filter); raises _BadQuery, before acting on anything, for any other
    body: a filter key misspelt would otherwise match every task."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind == "application/json":
        return _bulk_json(await _capped_body(request, BULK_BODY_MAX_BYTES))
    if kind not in ("application/x-www-form-urlencoded", "multipart/form-data"):
        raise _BadQuery(
            'send JSON (Content-Type: application/json), {"ids": [...]} or '
            '{"filter": {...}}, or the /tasks page\'s form'
        )
    form = await _form(request)
    if form.get("everything"):
        shown = {k: str(v) for k, v in form.items() if k not in ("after", "csrf", "ids")}
        return [], _filters_of(shown)
    texts = [str(x) for x in form.getlist("ids")]
    if len(texts) > BULK_MAX:
        raise _BadQuery(f"at most {BULK_MAX} ids at once")
    ids = [_whole(text, "an id", TASK_ID) for text in texts]
    return list(dict.fromkeys(i for i in ids if i is not None)), None


async def _capped_body(request: Request, limit: int) -> bytes:
    """The request's body; _TooLarge past ``limit`` bytes. A larger body is
    still read to its end, unkept, up to :data:`_DRAINED_MAX_BYTES` (a
    client that is still sending when the connection closes sees a reset,
    not the 413); past that, or a Content-Length above it, it is left."""
    declared = request.headers.get("content-length", "")
    too_large = _TooLarge(f"the body is over {limit:,} bytes")
    if declared.isdigit() and int(declared) > _DRAINED_MAX_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > _DRAINED_MAX_BYTES:
            break
    if size > limit:
        raise too_large
    return b"".join(chunks)


def _bulk_json(body: bytes) -> tuple[list[int], dict[str, Any] | None]:
    """_bulk_request's answer for a JSON body: task ids as JSON integers,
    a filter's ids too, its texts as strings; nothing else."""
    try:
        given = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise _BadQuery("the body is not JSON") from None
    if not isinstance(given, dict) or set(given) not in ({"ids"}, {"filter"}):
        raise _BadQuery('give {"ids": [...]} or {"filter": {...}}, and nothing else')
    if "filter" in given:
        return [], _filters_of(_json_filter(given["filter"]))
    listed = given["ids"]
    if not isinstance(listed, list):
        raise _BadQuery("ids is a list of task ids")
    if len(listed) > BULK_MAX:
        raise _BadQuery(f"at most {BULK_MAX} ids at once")
    for value in listed:
        if not TASK_ID.contains(value):
            raise _BadQuery(f"an id {_shown(json.dumps(value))} is not {TASK_ID.describe()}")
    return list(dict.fromkeys(listed)), None


def _json_filter(given: Any) -> dict[str, str]:
    """A bulk action's JSON filter as ``/api/tasks``'s query parameters:
    _BadQuery for an unknown key, a text that is not a string, an id that
    is not a JSON integer (null: any)."""
    keys = ", ".join(BULK_FILTER_KEYS)
    if not isinstance(given, dict):
        raise _BadQuery(f"filter is an object of {keys}")
    found: dict[str, str] = {}
    for key, value in given.items():
        if key not in BULK_FILTER_KEYS:
            raise _BadQuery(f"unknown filter key '{_shown(key)}': one of {keys}")
        if value is None:
            continue
        if key.endswith("_id"):
            if not TASK_ID.contains(value):
                raise _BadQuery(f"{key} {_shown(json.dumps(value))} is not {TASK_ID.describe()}")
        elif not isinstance(value, str):
            raise _BadQuery(f"{key} is a string, not {_shown(json.dumps(value))}")
        found[key] = str(value)
    return found


def _filters_of(query: Mapping[str, str]) -> dict[str, Any]:
    """_task_filters of ``query``."""
    state = query.get("state") or None
    if state is not None and state not in TASK_STATES:
        raise _BadQuery(f"unknown state '{_shown(state)}': one of {', '.join(TASK_STATES)}")
    found: dict[str, Any] = {"state": state}
    for name in ("process", "external_key"):
        text = query.get(name) or None  # an empty form field: any
        if text is not None and "\x00" in text:
            raise _BadQuery(f"{name} holds a NUL character")
        found[name] = text
    limit = _whole(query.get("limit"), "limit", TASK_PAGE)
    found["limit"] = DEFAULT_TASK_PAGE if limit is None else limit
    found["min_id"] = _whole(query.get("min_id"), "min_id", TASK_ID)
    found["max_id"] = _whole(query.get("max_id"), "max_id", TASK_ID)
    found["before"] = _whole(query.get("after"), "after", TASK_ID, what="a cursor (next)")
    return found


def _whole(text: str | None, name: str, bounds: Range, what: str = "") -> int | None:
    if text is None or text == "":
        return None
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 25 else None
    if value is None or not bounds.contains(value):
        wanted = what or bounds.describe()
        raise _BadQuery(f"{name} '{_shown(text)}' is not {wanted}")
    return value


def _shown(text: str) -> str:
    """A query parameter in an error: one line, at most 40 characters."""
    text = escape_controls(text)
    return text if len(text) <= 40 else text[:40] + "…"


def _payload(stored: str | None) -> Any:
    """A stored payload decoded, its secrets masked."""
    return redact_json(decode_payload(stored))


def _payload_text(stored: str | None) -> str:
    """A payload for a page: its masked JSON, cut at 500 characters."""
    text = json.dumps(_payload(stored), ensure_ascii=False)
    return text if len(text) <= 500 else text[:500] + "…"


def _task_json(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "chain": row.id_inicial or row.id,
        "process": row.processo,
        "state": task_state(row),
        "attempt": row.tentativa or 1,
        "external_key": row.chave_externa,
        "payload": _payload(row.payload),
        "run_at": _iso(row.data_hora),
        "started_at": _iso(row.started_at),
        "finished_at": _iso(row.finished_at),
    }


def _last_heartbeat(row: Any, lease: dt.timedelta) -> dt.datetime | None:
    """When a worker last claimed or renewed: the heartbeat writes only the
    new deadline (renewal + the worker's lease) and a claim its start too,
    so the newest deadline less the lease, or the newest claim if later
    (a worker whose lease is shorter than the dashboard's ``lease_seconds``)."""
    claimed, deadline = _utc(row.started_at), _utc(row.lease_expires_at)
    known = [at for at in (claimed, None if deadline is None else deadline - lease) if at]
    return max(known) if known else None


def _utc(at: dt.datetime | None) -> dt.datetime | None:
    # MySQL's MAX() of a DATETIME comes back naive: it is UTC
    if at is None or at.tzinfo is not None:
        return at
    return at.replace(tzinfo=dt.timezone.utc)


def _iso(at: dt.datetime | None) -> str | None:
    """ISO 8601, UTC."""
    at = _utc(at)
    return None if at is None else at.astimezone(dt.timezone.utc).isoformat()


def _same(given: Any, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def _visible(value: Any) -> Any:
    """Text with its control and bidi characters as visible escapes
    (``\\x1b``, ``\\u202e``; newlines kept): the finalize step of every
    ``{{ }}`` of the pages."""
    if not isinstance(value, str) or isinstance(value, Markup) or value.isprintable():
        return value
    return escape_controls(value, multiline=True)


class _Conflict(Exception):
    pass


class _StatusView:
    """QueueStatus for the templates: the counts as dicts by state."""

    def __init__(self, status: Any, data: dict[str, Any]) -> None:
        self.processes = data["processes"]
        self.totals = data["totals"]
        self.throughput = status.throughput
        self.running = status.running
        self.failures = status.failures
        self.health = status.health
        self.paused = status.paused


def _actions_for(timeline: Any) -> list[tuple[str, str]]:
    actions: list[tuple[str, str]] = []
    if timeline.state in ("ready", "scheduled", "retrying"):
        actions.append(("cancel", "Cancel"))
    own = timeline.of_kind("attempt")
    if own and own[-1].status == "agendada":
        actions.append(("retry-now", "Retry now"))
    dead_runs = timeline.of_kind("dead_letter")
    if dead_runs and not timeline.of_kind("requeued"):
        actions.append(("requeue", "Requeue"))
    return actions


def _limits_of(worker: Any, process: str | None) -> dict[str, Any]:
    """What the worker class declares of ``process``: its fleet-wide
    concurrency limit and rate limit (docs/limits.md), when it has one."""
    found: dict[str, Any] = {}
    if worker is None or process is None:
        return found
    concurrency = dict(getattr(worker, "concurrency_limits", None) or {}).get(process)
    rate = dict(getattr(worker, "rate_limits", None) or {}).get(process)
    if concurrency is not None:
        found["concurrency"] = concurrency
    if rate is not None:
        found["rate"] = rate
    return found


def _fairness_of(worker: Any) -> dict[str, Any] | None:
    """The worker class's fairness (``fair_by`` and its per-key limits), or None."""
    fair_by = getattr(worker, "fair_by", None) if worker is not None else None
    if not fair_by:
        return None
    return {
        "by": fair_by,
        "key_concurrency": getattr(worker, "key_concurrency_limit", None),
        "key_rate": getattr(worker, "key_rate_limit", None),
    }


def _wants_json(request: Request) -> bool:
    return "x-csrf-token" in request.headers or "application/json" in request.headers.get(
        "accept", ""
    )


def _unknown_action(request: Request, action: str, known: Sequence[str]) -> Response | None:
    """404 for an action not in ``known``, or None."""
    if action in known:
        return None
    return _answer(request, 404, f"no such action ({', '.join(known)})")


def _answer(request: Request, code: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message}, status_code=code)
    # the text is escaped: it may name a task or a process, never markup
    shown = escape(_visible(message))
    return HTMLResponse(f'<p class="warn" id="error">{shown}</p>', status_code=code)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _SecurityHeaders:
    """Adds the security headers to every HTTP response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
