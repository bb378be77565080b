"""The operations commands: ``maintenance run``, ``requeue``, ``config show``.

Each takes the worker class (``module:Class``) whose queue it works on, and
the database as ``sqla-queue worker`` does (``--url``, else
``SQLA_QUEUE_URL``, else the ``DB_*`` variables); its settings are the
worker's (class, environment, ``queue_configuration``, defaults). Mistakes
are one ``Error:`` line and exit status 1; a database error too. What they
print from the database is escaped (checks.shown).

``maintenance run`` builds the worker's parts (``QueueApp``: its routines);
the others, like the operator's commands of ``status.py``, need only the
configuration and the adapter (:func:`_operator`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import click
from sqlalchemy.exc import DBAPIError

from ..common.exceptions import SqlaQueueError
from ..common.redaction import describe_error
from ..config.ranges import REQUEUE_LIMIT, TASK_ID
from ..config.resolution import resolve, show
from ..config.settings import Settings, normalize_url
from ..config.sources import SCHEMA_WIDE
from ..maintenance import ROUTINES
from ..worker.operator import OperatorContext
from .checks import CommandError, Number, Timestamp, shown
from .loading import load_worker
from .progress import progress_bar

__all__ = ["config", "maintenance", "requeue"]


@contextlib.contextmanager
def _one_error_line() -> Iterator[None]:
    """A mistake or a database error as one Error line."""
    try:
        yield
    except SqlaQueueError as exc:
        raise CommandError(str(exc)) from exc
    except DBAPIError as exc:
        raise CommandError(f"database error: {describe_error(exc)}") from exc


@contextlib.contextmanager
def _operator(worker: str, url: str | None) -> Iterator[OperatorContext]:
    """The worker's queue as an operator's command needs it (its engine,
    configuration and adapter: nothing built to run it)."""
    with _one_error_line():
        context = OperatorContext(load_worker(worker), url=url, settings=Settings.from_env())
        try:
            context.check_table(wait_for_database=True)
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def _app(worker: str, url: str | None) -> Iterator[Any]:
    """The worker's parts (nothing started): its engine, adapter, settings
    and routines."""
    from ..worker.app import QueueApp

    with _one_error_line():
        cls = load_worker(worker)
        cls.check_configuration()
        app = QueueApp(cls(), url=url, settings=Settings.from_env())
        try:
            app.check_table(wait_for_database=True)
            yield app
        finally:
            app.close()
            app.engine.dispose()


@click.group()
def maintenance() -> None:
    """Run a maintenance routine by hand."""


@maintenance.command("run")
@click.argument("routine", type=click.Choice(ROUTINES))
@click.argument("worker")
@click.option("--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]")
@click.option("--dry-run", is_flag=True, help="count what it would do; change nothing")
def run(routine: str, worker: str, url: str | None, dry_run: bool) -> None:
    """Run ROUTINE (rescue, schedule, purge, ttl, vacuum, periodic) of
    WORKER's queue once, now, and print what it did. It takes no lock: the
    routines are safe beside running workers (periodic: each occurrence is
    still enqueued once)."""
    with _app(worker, url) as app:
        if routine not in app.maintenance.routines:
            raise CommandError(
                f"{type(app.worker).__name__} has no {routine} routine "
                "(periodic: the class declares no periodic tasks)"
            )
        with progress_bar(routine) as progress:
            result = app.maintenance.run_now(routine, dry_run=dry_run, progress=progress)
    click.echo(shown(result.describe()))
    if result.error:
        raise CommandError(f"{routine} stopped: {result.error}")


@click.command()
@click.argument("worker")
@click.option(
    "--id", "ids", type=Number(TASK_ID), multiple=True, help="a dead-letter row's or its task's id"
)
@click.option("--process", help="dead tasks of this processo")
@click.option("--since", type=Timestamp(), help="went dead at or after (ISO 8601, UTC)")
@click.option("--until", type=Timestamp(), help="went dead before (ISO 8601, UTC)")
@click.option("--all", "all_dead", is_flag=True, help="every dead task")
@click.option(
    "--limit", type=Number(REQUEUE_LIMIT), default=10_000, show_default=True, help="1 to 10,000"
)
@click.option("--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]")
@click.option("--dry-run", is_flag=True, help="list what would be requeued; change nothing")
def requeue(
    worker: str,
    ids: tuple[int, ...],
    process: str | None,
    since: dt.datetime | None,
    until: dt.datetime | None,
    all_dead: bool,
    limit: int,
    url: str | None,
    dry_run: bool,
) -> None:
    """Requeue dead tasks of WORKER's queue: each starts a new chain with its
    payload, linked to the old one, once. Select them with --id, --process,
    --since/--until, or --all."""
    from ..client.queue import QueueClient

    if not (ids or process or since or until or all_dead):
        raise click.UsageError("select dead tasks with --id, --process, --since/--until or --all")
    with _operator(worker, url) as queue, queue.engine.connect() as conn:
        transaction = conn.begin()
        try:
            with progress_bar("requeue") as progress:
                done = QueueClient(conn, queue.adapter.table).requeue_dead(
                    ids or None,
                    process=process,
                    since=since,
                    until=until,
                    all_dead=all_dead,
                    limit=limit,
                    dry_run=dry_run,
                    progress=progress,
                )
        except BaseException:
            transaction.rollback()
            raise
        if dry_run:
            transaction.rollback()
        else:
            transaction.commit()
    for item in done:
        target = "(dry run)" if item.new_id is None else f"-> new task {item.new_id}"
        click.echo(
            f"dead-letter {item.dead_id} (task {item.live_id}, {shown(item.process)}) {target}"
        )
    verb = "would requeue" if dry_run else "requeued"
    click.echo(f"{verb} {len(done)} dead task(s)")


def _rows_applied(rows: Any) -> str:
    """How many configuration rows apply to the worker's queue, and why."""
    if rows is None:
        return "none"
    scopes = [row.scope for row in rows.values()]
    if all(scope is None for scope in scopes):
        return f"{len(rows)} row(s), schema-wide (the table has no queue_name column)"
    wide = sum(1 for scope in scopes if scope == SCHEMA_WIDE)
    return (
        f"{len(rows)} row(s) applied: {len(rows) - wide} for this queue, {wide} for every queue (*)"
    )


@click.group()
def config() -> None:
    """The settings a worker runs with."""


@config.command("show")
@click.argument("worker")
@click.option("--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]")
def config_show(worker: str, url: str | None) -> None:
    """Print WORKER's effective settings and where each comes from (its
    class, a variable, the queue_configuration table, the default)."""

    try:
        settings = Settings.from_env()
        cls = load_worker(worker)
        cls.check_configuration()
        if url is None and settings.url is None:
            click.echo("(no database given: queue_configuration not read)")
            effective = resolve(cls, settings, None)
        else:
            with _operator(worker, url) as queue:
                effective = queue.effective
                rows = queue.configuration_rows
                click.echo(f"queue_configuration: {_rows_applied(rows)}")
    except SqlaQueueError as exc:
        raise CommandError(str(exc)) from exc
    click.echo(f"{'setting':<34} {'value':<30} source")
    given = {} if url is None else {"url": normalize_url(url).render_as_string(hide_password=True)}
    for line in show(effective, settings, given=given):
        click.echo(shown(line))  # values of the queue_configuration table among them
