"""The web dashboard: Starlette (small, well kept, the ASGI toolkit FastAPI
is built on) served by uvicorn, pages from Jinja2 with autoescape on.

Reads need no login; the server binds to 127.0.0.1 unless told otherwise.
Writes (requeue, cancel, retry now) need a login with the configured
credential (``SQLA_QUEUE_DASHBOARD_PASSWORD``, user ``admin`` or
``SQLA_QUEUE_DASHBOARD_USER``); with none configured there is no default
password and every write is refused with 403. Each write carries the
session's CSRF token (a form field, or the ``X-CSRF-Token`` header); the
session cookie is signed, HttpOnly and SameSite=Strict. Every response
says ``Content-Security-Policy: default-src 'none'`` plus this app's own
script and stylesheet, and task messages are escaped.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import DictLoader, Environment, select_autoescape
from sqlalchemy import Engine, select
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..client import QueueClient, resolve_table
from ..exceptions import SqlaQueueError, TaskNotFoundError
from ..inspect import (
    STATES,
    dead_letter,
    describe_age,
    queue_status,
    recent_copies,
    task_timeline,
)
from ..pause import pause, resume
from .assets import CSS, JS, TEMPLATES

__all__ = ["DashboardConfig", "create_app"]

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
    "writes are disabled: set SQLA_QUEUE_DASHBOARD_PASSWORD (and restart the dashboard) "
    "to requeue, cancel and retry from here"
)


@dataclass(frozen=True)
class DashboardConfig:
    """``password``: the credential writes need (None: no writes);
    ``secret_key``: signs the session cookie (a random one per process by
    default: a restart logs everyone out)."""

    user: str = "admin"
    password: str | None = None
    secret_key: str | None = None
    root: str = ""
    window_seconds: float = 300.0


def create_app(
    engine: Engine,
    model: Any,
    *,
    subscriber_model: Any = None,
    config: DashboardConfig | None = None,
    periodic: Sequence[Any] = (),
) -> Starlette:
    """The dashboard of ``model``'s queue table on ``engine``."""
    config = config or DashboardConfig()
    table = resolve_table(model)
    # the model, when given one: it names its configuration table
    queue: Any = model if isinstance(model, type) else table
    env = Environment(loader=DictLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    env.globals.update(
        when=lambda at: "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S"),
        age=describe_age,
        mb=lambda n: f"{n / 1048576:.1f} MB",
        states=STATES,
    )
    writes = config.password is not None

    def page(request: Request, name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        html = env.get_template(name).render(
            queue=table.name,
            root=config.root,
            user=request.session.get("user"),
            csrf=_csrf(request),
            writes_enabled=writes,
            can_write=writes and bool(request.session.get("user")),
            notice=_NOTICES.get(request.query_params.get("done", "")),
            **values,
        )
        return HTMLResponse(html, status_code=status_code)

    def overview(request: Request) -> Response:
        status = queue_status(
            engine, queue, window_seconds=config.window_seconds, periodic=periodic
        )
        data = status.as_json()
        oldest = status.oldest_ready_seconds
        return page(
            request,
            "overview.html",
            # the counts as dicts: the template indexes them by state name
            status=_StatusView(status, data),
            oldest="none" if oldest is None else describe_age(oldest),
            window=describe_age(config.window_seconds),
        )

    def task(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        try:
            timeline = task_timeline(engine, table, task_id)
        except TaskNotFoundError as exc:
            return page(request, "error.html", 404, error=str(exc))
        return page(request, "task.html", timeline=timeline, actions=_actions_for(timeline))

    def dead(request: Request) -> Response:
        return page(request, "dead.html", dead=dead_letter(engine, table, limit=100))

    def subscriptions(request: Request) -> Response:
        rows: list[dict[str, Any]] | None = None
        if subscriber_model is not None:
            c = subscriber_model.__table__.c
            # never the headers or the signing secret
            columns = (c.id, c.processo, c.ativo, c.url)
            with engine.connect() as conn:
                rows = [
                    {"id": r[0], "process": r[1], "active": r[2], "url": r[3]}
                    for r in conn.execute(select(*columns).order_by(c.processo, c.id))
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
        try:
            timeline = task_timeline(engine, table, request.path_params["task_id"])
        except TaskNotFoundError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse(timeline.as_json())

    async def act(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        action = request.path_params["action"]
        refused = await _refuse_write(request, writes)
        if refused is not None:
            return refused
        try:
            with engine.connect() as conn, conn.begin():
                client = QueueClient(conn, table)
                if action == "requeue":
                    done = client.requeue_dead([task_id])
                    if not done:
                        raise _Conflict(
                            f"task {task_id} is not a dead task, or it was requeued already"
                        )
                    shown = done[0].new_id
                elif action == "cancel":
                    client.cancel(task_id)
                    shown = task_id
                else:
                    client.retry_now(task_id)
                    shown = task_id
        except TaskNotFoundError as exc:
            return _answer(request, 404, str(exc))
        except (_Conflict, SqlaQueueError) as exc:
            return _answer(request, 409, str(exc))
        if _wants_json(request):
            return JSONResponse({"ok": True, "action": action, "task": shown})
        return RedirectResponse(f"{config.root}/tasks/{shown}?done={action}", status_code=303)

    async def pausing(request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("pause", "resume"):
            return _answer(request, 404, "no such action (pause, resume)")
        refused = await _refuse_write(request, writes, check_action=False)
        if refused is not None:
            return refused
        form = await request.form()
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
        return RedirectResponse(f"{config.root}/?done={action}", status_code=303)

    def login_page(request: Request) -> Response:
        if not writes:
            return page(request, "error.html", 403, error=_READ_ONLY)
        return page(request, "login.html", error=None)

    async def login(request: Request) -> Response:
        if not writes:
            return page(request, "error.html", 403, error=_READ_ONLY)
        form = await request.form()
        if not _csrf_ok(request, form.get("csrf")):
            return page(request, "error.html", 403, error="CSRF token missing or wrong")
        user, password = str(form.get("username", "")), str(form.get("password", ""))
        assert config.password is not None
        good_user = hmac.compare_digest(user.encode(), config.user.encode())
        good_password = hmac.compare_digest(password.encode(), config.password.encode())
        if not (good_user and good_password):
            return page(request, "login.html", 401, error="wrong user or password")
        request.session.clear()
        request.session["user"] = config.user
        request.session["csrf"] = secrets.token_urlsafe(32)
        return RedirectResponse(f"{config.root}/?done=logged-in", status_code=303)

    async def logout(request: Request) -> Response:
        form = await request.form()
        if not _csrf_ok(request, form.get("csrf")):
            return page(request, "error.html", 403, error="CSRF token missing or wrong")
        request.session.clear()
        return RedirectResponse(f"{config.root}/?done=logged-out", status_code=303)

    def css(request: Request) -> Response:
        return Response(CSS, media_type="text/css")

    def js(request: Request) -> Response:
        return Response(JS, media_type="text/javascript")

    routes = [
        Route("/", overview),
        Route("/tasks/{task_id:int}", task),
        Route("/dead", dead),
        Route("/subscriptions", subscriptions),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/status", api_status),
        Route("/api/tasks/{task_id:int}", api_task),
        Route(
            "/api/tasks/{task_id:int}/{action:str}",
            act,
            methods=["POST"],
        ),
        Route("/api/processes/{action:str}", pausing, methods=["POST"]),
        Route("/static/app.css", css),
        Route("/static/app.js", js),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=config.secret_key or secrets.token_hex(32),
                session_cookie="sqla_queue_dashboard",
                same_site="strict",
                max_age=8 * 3600,
            ),
        ],
    )
    return app


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


def _csrf(request: Request) -> str:
    token = request.session.get("csrf")
    if not token:
        token = request.session["csrf"] = secrets.token_urlsafe(32)
    return str(token)


def _csrf_ok(request: Request, given: Any) -> bool:
    expected = request.session.get("csrf")
    return (
        isinstance(given, str)
        and isinstance(expected, str)
        and hmac.compare_digest(given.encode(), expected.encode())
    )


def _wants_json(request: Request) -> bool:
    return "x-csrf-token" in request.headers or "application/json" in request.headers.get(
        "accept", ""
    )


async def _refuse_write(
    request: Request, writes: bool, *, check_action: bool = True
) -> Response | None:
    if check_action and request.path_params["action"] not in ("requeue", "cancel", "retry-now"):
        return _answer(request, 404, "no such action (requeue, cancel, retry-now)")
    if not writes:
        return _answer(request, 403, _READ_ONLY)
    if not request.session.get("user"):
        return _answer(request, 401, "log in to act on tasks")
    given = request.headers.get("x-csrf-token")
    if given is None:
        form = await request.form()
        given = form.get("csrf")  # type: ignore[assignment]
    if not _csrf_ok(request, given):
        return _answer(request, 403, "CSRF token missing or wrong")
    return None


def _answer(request: Request, code: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message}, status_code=code)
    # the text is escaped: it may name a task's state, never markup
    from html import escape

    return HTMLResponse(f'<p class="warn" id="error">{escape(message)}</p>', status_code=code)


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
