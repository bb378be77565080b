"""The operator's commands: ``status`` (what a queue is doing), ``cancel``
and ``retry-now`` (acting on waiting tasks).

``status`` counts tasks, not attempts (the definitions: sqla_queue.ops.status
and docs/operations.md) and renders them with rich; ``--json`` prints
exactly one JSON object, ``--watch`` refreshes in place, ``--task ID``
shows one chain as a timeline, ``--workflow ID`` a workflow's steps
(sqla_queue.ops.workflow_view). Task messages are shown as text, never as
markup, their control characters escaped (checks.shown); ``--json`` is
json.dumps' (every non-ASCII character escaped).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..common.exceptions import SqlaQueueError
from ..config.ranges import OLDER_THAN_SECONDS, TASK_ID, WATCH_SECONDS, WINDOW_SECONDS
from .checks import Duration, Number, shown
from .operations import _operator

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.text import Text

    from ..ops.status import QueueStatus, Timeline
    from ..ops.workflow_view import WorkflowStatus

# rich and sqla_queue.ops.status are imported by the commands that use them:
# every other command (a worker's start, each CLI call) skips their import

__all__ = ["cancel", "dashboard", "pause", "resume", "retry_now", "status"]

_URL_HELP = "SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]"

T = TypeVar("T")


@click.command()
@click.argument("worker")
@click.option("--url", help=_URL_HELP)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object and exit")
@click.option("--watch", is_flag=True, help="refresh in place until Ctrl-C")
@click.option(
    "--interval",
    type=Number(WATCH_SECONDS),
    default=2.0,
    show_default=True,
    help="seconds between refreshes (--watch), 0.5 to 3600",
)
@click.option("--task", "task_id", type=Number(TASK_ID), help="one task's chain as a timeline")
@click.option(
    "--workflow", "workflow_id", type=Number(TASK_ID), help="one workflow's steps and states"
)
@click.option(
    "--window",
    type=Duration(WINDOW_SECONDS),
    default="5m",
    show_default=True,
    help="throughput and failure rate over this long",
)
def status(
    worker: str,
    url: str | None,
    as_json: bool,
    watch: bool,
    interval: float,
    task_id: int | None,
    workflow_id: int | None,
    window: dt.timedelta,
) -> None:
    """What WORKER's queue is doing: tasks by process and state (ready,
    scheduled, running, retrying, succeeded, failed, cancelled,
    dead_letter), the oldest ready task's age, the attempts finished
    recently and the newest failed ones, running attempts, and on
    PostgreSQL the table's size, dead tuples and vacuum horizon."""
    from ..ops.status import queue_status, task_timeline

    if watch and as_json:
        raise click.UsageError("--watch and --json do not go together")
    if workflow_id is not None and task_id is not None:
        raise click.UsageError("--workflow goes without --task")
    with _operator(worker, url) as queue:
        model = queue.model
        if workflow_id is not None:
            from ..ops.workflow_view import workflow_status

            _show_one(
                lambda: workflow_status(queue.engine, model, workflow_id),
                lambda found: found.as_dict(),
                _render_workflow,
                as_json=as_json,
                watch=watch,
                interval=interval,
            )
            return
        if task_id is not None:
            _show_one(
                lambda: task_timeline(queue.engine, model, task_id),
                lambda timeline: timeline.as_json(),
                _render_timeline,
                as_json=as_json,
                watch=watch,
                interval=interval,
            )
            return

        def take() -> QueueStatus:
            return queue_status(
                queue.engine,
                model,
                window_seconds=window.total_seconds(),
                periodic=queue.worker_class.periodic,
            )

        if as_json:
            click.echo(json.dumps(take().as_json()))
        elif watch:
            _watch(lambda: _render(take()), interval)
        else:
            _console().print(_render(take()))


def _show_one(
    read: Callable[[], T],
    data: Callable[[T], dict[str, Any]],
    rendered: Callable[[T], Group],
    *,
    as_json: bool,
    watch: bool,
    interval: float,
) -> None:
    """One object (a task, a workflow), ``read()``: its JSON (``--json``),
    its rendering read again every ``interval`` seconds (``--watch``), or
    its rendering once."""
    if watch:
        _watch(lambda: rendered(read()), interval)
    elif as_json:
        click.echo(json.dumps(data(read())))
    else:
        _console().print(rendered(read()))


def _console() -> Console:
    """The terminal's width; 200 columns into a pipe or a file (rich's 80
    would fold every name and message)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def _watch(rendered: Callable[[], Group], interval: float) -> None:
    """``rendered()`` shown, then shown again every ``interval`` seconds
    in its place, until Ctrl-C."""
    from rich.live import Live

    stop = threading.Event()
    with Live(rendered(), console=_console(), auto_refresh=False, screen=False) as live:
        try:
            while not stop.wait(interval):
                live.update(rendered(), refresh=True)
        except KeyboardInterrupt:
            pass


# ------------------------------------------------------------ rendering


def _text(value: object, style: str = "", *, multiline: bool = False) -> Text:
    """``value`` as a rich Text: never markup, its control characters
    escaped (a table cell is one line; ``multiline`` keeps a traceback's)."""
    from rich.text import Text

    return Text(shown(value, multiline=multiline), style=style)


def _render(status: QueueStatus) -> Group:
    from rich.console import Group
    from rich.table import Table

    from ..ops.status import STATES

    parts: list[Any] = []
    # each block says what it counts: tasks (chains of attempts) or attempts
    counts = Table(title=_text(f"queue {status.queue}: tasks by state"), title_justify="left")
    counts.add_column("process", no_wrap=True)
    for state in STATES:
        counts.add_column(state, justify="right", no_wrap=True, min_width=len(state))
    for name, by in status.processes.items():
        label = _text(name or "(none)")
        if name in status.paused:
            label.append(" (paused)", style="bold yellow")
        counts.add_row(label, *(_n(getattr(by, s)) for s in STATES))
    counts.add_row(_text("total", "bold"), *(_n(getattr(status.totals, s)) for s in STATES))
    parts.append(counts)
    if status.tenants:
        tenants = Table(title="tasks by tenant and state", title_justify="left")
        tenants.add_column("tenant", no_wrap=True)
        for state in STATES:
            tenants.add_column(state, justify="right", no_wrap=True, min_width=len(state))
        for tenant, by in status.tenants.items():
            tenants.add_row(_text(tenant), *(_n(getattr(by, s)) for s in STATES))
        parts.append(tenants)
    t = status.throughput
    oldest = status.oldest_ready_seconds
    rate = "-" if t.failure_rate is None else f"{t.failure_rate:.1%}"
    line = f"oldest ready task: {'none' if oldest is None else _age(oldest)}"
    left_out = status.oldest_ready_paused_left_out
    if left_out:
        line += f" ({left_out} paused process{'' if left_out == 1 else 'es'} left out)"
    parts.append(_text(line))
    parts.append(
        _text(
            f"attempts finished in the last {_age(t.window_seconds)}: {t.finished} "
            f"({t.per_minute:.1f}/min): {t.succeeded} succeeded, {t.failed} failed "
            f"({rate} of those that ran), {t.cancelled} cancelled"
        )
    )
    if status.running:
        running = Table(title="running attempts", title_justify="left")
        for column in ("task", "chain", "process", "attempt", "worker", "running for", "lease"):
            running.add_column(column)
        for item in status.running:
            lease = "-" if item.lease_expires_at is None else _time(item.lease_expires_at)
            running.add_row(
                str(item.id),
                str(item.chain_id),
                _text(item.process),
                f"{item.attempt}{' (dead letter)' if item.dead else ''}",
                _text(item.worker_id or "-"),
                "-" if item.running_seconds is None else _age(item.running_seconds),
                lease,
            )
        parts.append(running)
    if status.failures:
        failures = Table(title="newest failed attempts", title_justify="left")
        for column in ("task", "chain", "process", "attempt", "finished"):
            failures.add_column(column, no_wrap=True)
        failures.add_column("message", ratio=1, min_width=20)
        for failure in status.failures:
            failures.add_row(
                str(failure.id),
                str(failure.chain_id),
                _text(failure.process),
                str(failure.attempt),
                "-" if failure.finished_at is None else _time(failure.finished_at),
                _message(failure.message),
            )
        parts.append(failures)
    if status.periodic:
        periodic = Table(title="periodic tasks", title_justify="left")
        for column in ("name", "schedule", "process", "last enqueued", "next run"):
            periodic.add_column(column, no_wrap=True)
        for entry in status.periodic:
            periodic.add_row(
                _text(entry["name"]),
                _text(entry["schedule"]),
                _text(entry["process"]),
                _text(entry["last_enqueued"] or "-"),
                _text(entry["next_run"]),
            )
        parts.append(periodic)
    if status.routine_locks:
        locks = Table(title="routine locks", title_justify="left")
        for column in ("routine", "held by", "session", "client", "connected", "silent for"):
            locks.add_column(column, no_wrap=True)
        for holder in status.routine_locks:
            silent = holder.silent_seconds
            locks.add_row(
                _text(holder.routine),
                _text(holder.worker or "-"),
                str(holder.session),
                _text(holder.client or "-"),
                "-" if holder.connected_at is None else _time(holder.connected_at),
                "-" if silent is None else _age(silent),
            )
        parts.append(locks)
    if status.health is not None:
        h = status.health.table
        held = "none" if h.horizon_seconds is None else _age(h.horizon_seconds)
        parts.append(
            _text(
                f"table: {_mb(h.table_bytes)} + indexes {_mb(h.index_bytes)}, "
                f"{h.dead_tuples:,} dead row versions, {h.live_tuples:,} live; "
                f"oldest snapshot held for {held}"
            )
        )
        if status.health.warning:
            # it names the session that holds the horizon: its application_name
            parts.append(_text(f"warning: {status.health.warning}", "bold yellow"))
    return Group(*parts)


def _render_timeline(timeline: Timeline) -> Group:
    from rich.console import Group
    from rich.table import Table

    key = "" if timeline.external_key is None else f", chave_externa {timeline.external_key}"
    own = timeline.own_chain_id
    chain = f"chain {timeline.chain_id}"
    if own is not None and own != timeline.chain_id:
        # a dead-letter run's or a requeued chain's id: its own state
        of = "dead-letter run" if timeline.state == "dead_letter" else "requeued chain"
        chain = f"{of} {own} of task {timeline.chain_id}"
    title = f"task {timeline.task_id}: {chain} ({timeline.process}{key}), {timeline.state}"
    if timeline.requeued and (own is None or own == timeline.chain_id):
        title += "; requeued as " + ", ".join(
            f"task {head}: {state}" for head, state in timeline.requeued.items()
        )
    table = Table(title=_text(title), title_justify="left")
    for column in ("kind", "id", "attempt", "state", "run at", "took", "worker"):
        table.add_column(column, no_wrap=True)
    table.add_column("message", ratio=1, min_width=20)
    for row in timeline.rows:
        took = "-"
        if row.started_at is not None and row.finished_at is not None:
            took = _age((row.finished_at - row.started_at).total_seconds())
        kind = row.kind.replace("_", " ")
        if row.subscriber_id:
            kind = f"{kind} ({row.subscriber_id})"
        table.add_row(
            _text(kind),
            str(row.id),
            str(row.attempt),
            _text(row.label),
            "-" if row.run_at is None else _time(row.run_at),
            took,
            _text(row.worker_id or "-"),
            _message(row.message),
        )
    parts: list[Any] = [table]
    for row in timeline.rows:
        if row.traceback:
            parts.append(
                _text(
                    f"\nattempt {row.id} ({row.kind} {row.attempt}) failed:", "bold", multiline=True
                )
            )
            # a traceback is lines by design: its newlines stay
            parts.append(_text(row.traceback, multiline=True))
    return Group(*parts)


def _render_workflow(found: WorkflowStatus) -> Group:
    """The steps as a table (no result: the handlers' data, in --json only)."""
    from rich.console import Group
    from rich.table import Table

    title = (
        f"workflow {found.workflow} of {found.queue} (on failure: {found.on_failure}): "
        f"{found.state}"
    )
    counts = ", ".join(f"{n:,} {state}" for state, n in found.counts().items())
    table = Table(title=_text(f"{title}; steps: {counts}"), title_justify="left")
    for column in ("step", "process", "state", "attempt", "task", "parents"):
        table.add_column(column, no_wrap=column != "parents")
    for step in found.steps:
        table.add_row(
            str(step.id),
            _text(step.process),
            _text(step.label),
            "-" if step.attempt is None else str(step.attempt),
            "-" if step.task_id is None else str(step.task_id),
            step.parents_shown(),
        )
    return Group(table)


def _message(message: str | None) -> Text:
    """A stored message as stored, with sqla-queue's own fixed texts said
    in English after it (ops.status.message_gloss): "[retry enqueued]"."""
    from ..ops.status import message_gloss

    text = _text(message)
    gloss = message_gloss(message)
    if gloss is not None:
        text.append(f" [{gloss}]", style="dim")
    return text


def _n(value: int) -> str:
    return f"{value:,}"


def _mb(value: int) -> str:
    return f"{value / 1048576:.1f} MB"


def _time(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _age(seconds: float) -> str:
    from ..ops.status import describe_age

    return describe_age(seconds)


# ------------------------------------------------------------ actions


@click.command()
@click.argument("worker")
@click.option(
    "--task", "task_ids", type=Number(TASK_ID), multiple=True, help="a task's id (repeatable)"
)
@click.option("--process", help="every waiting task of this processo")
@click.option(
    "--older-than",
    type=Duration(OLDER_THAN_SECONDS),
    help="with --process: only tasks whose first attempt is older (90s, 15m, 2h, 7d)",
)
@click.option("--url", help=_URL_HELP)
def cancel(
    worker: str,
    task_ids: tuple[int, ...],
    process: str | None,
    older_than: dt.timedelta | None,
    url: str | None,
) -> None:
    """Cancel waiting tasks of WORKER's queue: a pending or scheduled task
    ends as falha, "Tarefa cancelada pelo operador." (no retry, not dead
    letter). A running task is not touched. Select with --task or
    --process [--older-than]."""
    from ..client.control import CANCEL_CHUNK, cancel_process, cancel_task

    if bool(task_ids) == bool(process):
        raise click.UsageError("give --task ID (one or more) or --process NAME")
    if older_than is not None and not process:
        raise click.UsageError("--older-than goes with --process")
    refused = 0
    with _operator(worker, url) as queue, queue.engine.connect() as conn:
        if task_ids:
            for task_id in task_ids:
                try:
                    with conn.begin():
                        done = cancel_task(conn, queue.adapter, task_id)
                except SqlaQueueError as exc:
                    click.echo(f"Error: {shown(exc)}", err=True)
                    refused += 1
                    continue
                click.echo(f"task {task_id}: cancelled (attempt {', '.join(map(str, done.ids))})")
        else:
            assert process is not None
            total = 0
            while True:
                with conn.begin():
                    done = cancel_process(
                        conn, queue.adapter, process, older_than=older_than, limit=CANCEL_CHUNK
                    )
                total += done.count
                if len(done.ids) < CANCEL_CHUNK:
                    break
            click.echo(f"cancelled {total} waiting task(s) of {shown(process)}")
    if refused:
        raise SystemExit(1)


@click.command("retry-now")
@click.argument("worker")
@click.option("--task", "task_id", type=Number(TASK_ID), required=True, help="the task's id")
@click.option("--url", help=_URL_HELP)
def retry_now(worker: str, task_id: int, url: str | None) -> None:
    """Run a scheduled task of WORKER's queue now: a retry waiting out its
    backoff (or a task scheduled for later) becomes ready at once."""
    from ..client.control import retry_now as run_now

    with _operator(worker, url) as queue, queue.engine.connect() as conn, conn.begin():
        attempt = run_now(conn, queue.adapter, task_id)
    click.echo(f"task {task_id}: attempt {attempt} is ready now")


@click.command()
@click.argument("worker")
@click.option("--url", help=_URL_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=click.IntRange(1, 65535), default=8780, show_default=True)
@click.option(
    "--read-only",
    is_flag=True,
    default=None,
    help="reads need no login, every write is refused [default: SQLA_QUEUE_DASHBOARD_READ_ONLY]",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="a Host header name accepted besides the bind address, localhost, 127.0.0.1 "
    "and [::1] (repeatable; also SQLA_QUEUE_DASHBOARD_ALLOWED_HOSTS, comma-separated)",
)
@click.option(
    "--behind-tls-proxy",
    is_flag=True,
    default=None,
    help="a TLS proxy is in front: Secure cookie, X-Forwarded-* trusted from "
    "FORWARDED_ALLOW_IPS [default: SQLA_QUEUE_DASHBOARD_BEHIND_TLS]",
)
def dashboard(
    worker: str,
    url: str | None,
    host: str,
    port: int,
    read_only: bool | None,
    allowed_hosts: tuple[str, ...],
    behind_tls_proxy: bool | None,
) -> None:
    """Serve the web dashboard of WORKER's queue (sqla-queue[dashboard]):
    counts, throughput, running tasks, timelines, the dead letter,
    subscriptions. Every page needs a login with SQLA_QUEUE_DASHBOARD_PASSWORD
    (user: admin, or SQLA_QUEUE_DASHBOARD_USER); with --read-only reads need
    no login and every write is refused. Without a password and without
    --read-only it does not start."""
    import os
    from dataclasses import replace

    from ..config.kinds import Flag

    try:
        import uvicorn

        from ..ops.dashboard import DashboardConfig, create_app
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs its extra: pip install 'sqla-queue[dashboard]' ({exc.name})"
        ) from None
    listed = os.environ.get("SQLA_QUEUE_DASHBOARD_ALLOWED_HOSTS") or ""
    try:
        if read_only is None:
            raw = os.environ.get("SQLA_QUEUE_DASHBOARD_READ_ONLY") or "false"
            read_only = bool(Flag().parse("SQLA_QUEUE_DASHBOARD_READ_ONLY", raw))
        if behind_tls_proxy is None:
            raw = os.environ.get("SQLA_QUEUE_DASHBOARD_BEHIND_TLS") or "false"
            behind_tls_proxy = bool(Flag().parse("SQLA_QUEUE_DASHBOARD_BEHIND_TLS", raw))
        config = DashboardConfig(
            user=os.environ.get("SQLA_QUEUE_DASHBOARD_USER") or "admin",
            password=os.environ.get("SQLA_QUEUE_DASHBOARD_PASSWORD") or None,
            read_only=read_only,
            allowed_hosts=(host, *allowed_hosts, *(h for h in listed.split(",") if h.strip())),
            behind_tls_proxy=behind_tls_proxy,
        )
        config.check()  # before the database is touched
    except SqlaQueueError as exc:
        raise click.ClickException(str(exc)) from None
    with _operator(worker, url) as queue:
        cls = queue.worker_class
        # the workers' lease: /api/workers tells their last heartbeat by it
        config = replace(config, lease_seconds=queue.effective["lease_seconds"])
        web = create_app(
            queue.engine,
            cls.queue_model(),
            subscriber_model=getattr(cls, "subscriber_model", None),
            config=config,
            periodic=cls.periodic,
            worker=cls,
        )
        mode = "read-only, no login" if config.read_only else "login required"
        shown = f"[{host}]" if ":" in host else host
        table = queue.adapter.qualified_name
        click.echo(f"dashboard of {table} on http://{shown}:{port}/ ({mode})")
        # X-Forwarded-For and -Proto are trusted only from a proxy said to be there
        uvicorn.run(web, host=host, port=port, log_level="warning", proxy_headers=behind_tls_proxy)


@click.command()
@click.argument("worker")
@click.option(
    "--process", "processes", multiple=True, required=True, help="a processo (repeatable)"
)
@click.option("--url", help=_URL_HELP)
def pause(worker: str, processes: tuple[str, ...], url: str | None) -> None:
    """Pause PROCESS across the whole fleet of WORKER's queue: its tasks
    stay queued (counted as ready) and no worker claims them until resumed;
    running ones finish. Every worker sees it within 2 seconds."""
    from ..client.pause import PAUSE_CHECK_SECONDS
    from ..client.pause import pause as pause_processes

    with _operator(worker, url) as queue, queue.engine.connect() as conn, conn.begin():
        paused = pause_processes(conn, queue.model, processes)
    click.echo(
        f"paused: {shown(', '.join(sorted(paused)))} "
        f"(workers stop claiming them within {PAUSE_CHECK_SECONDS:.0f} s)"
    )


@click.command()
@click.argument("worker")
@click.option("--process", "processes", multiple=True, help="a processo (repeatable)")
@click.option("--all", "every", is_flag=True, help="every paused process")
@click.option("--url", help=_URL_HELP)
def resume(worker: str, processes: tuple[str, ...], every: bool, url: str | None) -> None:
    """Resume paused processes of WORKER's queue (--process, or --all)."""
    from ..client.pause import paused_processes
    from ..client.pause import resume as resume_processes

    if bool(processes) == every:
        raise click.UsageError("give --process NAME (one or more) or --all")
    with _operator(worker, url) as queue, queue.engine.connect() as conn, conn.begin():
        model = queue.model
        names = paused_processes(conn, model) if every else frozenset(processes)
        still = resume_processes(conn, model, names)
    click.echo(
        f"resumed: {shown(', '.join(sorted(names))) or 'nothing'}; still paused: "
        f"{shown(', '.join(sorted(still))) or 'none'}"
    )
