"""The ``sqla-queue`` group and its worker, schema and server commands."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import click
from sqlalchemy import URL, Engine

from ..common.dialects import DIALECTS
from ..common.exceptions import ConfigurationError, SqlaQueueError
from ..common.logs import configure
from ..config.ranges import COMMIT_BUDGET_MS, CONCURRENCY, LISTEN_PORT, PORT
from ..config.settings import Settings, make_engine
from ..schema.mixins import QueueMixin
from ..schema.subscribers import SubscriberMixin
from ..worker import WorkerBase, WorkerWebhook
from ..worker.base import BATCH_SIZE
from .checks import CommandError, Number
from .loading import load_model, load_worker


@click.group()
@click.version_option(package_name="sqla-queue")
def main() -> None:
    """Transactional job queues inside your SQLAlchemy database."""


def _worker_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options every worker command takes."""
    for option in reversed(
        [
            click.option(
                "--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]"
            ),
            click.option(
                "--concurrency",
                default=1,
                show_default=True,
                type=Number(CONCURRENCY),
                help="lanes in this process (1 to 10,000): threads, or for a worker whose "
                "handlers are async def, coroutines on one event loop (each lane holds two "
                "connections)",
            ),
            click.option(
                "--burst", is_flag=True, help="exit 0 once no task is ready (pending and due)"
            ),
            click.option(
                "--batch-size",
                type=Number(BATCH_SIZE),
                help="most tasks per claim, 1 to 10,000 (1: one task per claim and transaction)",
            ),
            click.option(
                "--commit-budget-ms",
                type=Number(COMMIT_BUDGET_MS),
                help="milliseconds a finished task's outcome may wait for its commit "
                "(0: each task commits alone) [default: the worker's commit_budget_ms, "
                "else SQLA_QUEUE_COMMIT_BUDGET_MS, else 10]",
            ),
            click.option(
                "--metrics-port",
                type=Number(PORT),
                envvar="SQLA_QUEUE_METRICS_PORT",
                help="serve Prometheus metrics on this port (/metrics; sqla-queue[metrics]) "
                "[env: SQLA_QUEUE_METRICS_PORT]",
            ),
            click.option(
                "--metrics-host",
                default="127.0.0.1",
                show_default=True,
                envvar="SQLA_QUEUE_METRICS_HOST",
                help="address the metrics listen on (0.0.0.0: every interface) "
                "[env: SQLA_QUEUE_METRICS_HOST]",
            ),
            click.option(
                "--tracing/--no-tracing",
                default=False,
                envvar="SQLA_QUEUE_TRACING",
                help="one OpenTelemetry span per task, a child of the trace that enqueued "
                "it (sqla-queue[otel]; the SDK is configured by your worker's module or "
                "opentelemetry-instrument) [env: SQLA_QUEUE_TRACING]",
            ),
            click.option(
                "--log-format",
                type=click.Choice(["text", "json"]),
                default="text",
                show_default=True,
                envvar="SQLA_QUEUE_LOG_FORMAT",
                help="json: one JSON object a line, with the task's ids, process and "
                "duration [env: SQLA_QUEUE_LOG_FORMAT]",
            ),
            click.option(
                "--log-level",
                default=None,
                type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
                help="[default: INFO, DEBUG with LOG_DEBUG=true]",
            ),
        ]
    ):
        function = option(function)
    return function


def _settings_and_logging(log_level: str | None, log_format: str = "text") -> Settings:
    """The environment's settings, and logging at ``log_level`` (else INFO,
    DEBUG with LOG_DEBUG=true), as text or JSON lines, pushed to Grafana
    Loki too when GRAFANA_URL is set (logs.py)."""
    settings = Settings.from_env()
    level = log_level or ("DEBUG" if settings.log_debug else "INFO")
    configure(level, log_format=log_format, grafana_url=settings.grafana_url, env=settings.env)
    return settings


def _run_worker(
    load: Callable[[], type[WorkerBase]],
    *,
    url: str | None,
    concurrency: int,
    burst: bool,
    batch_size: int | None,
    log_level: str | None,
    commit_budget_ms: float | None = None,
    log_format: str = "text",
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    tracing: bool = False,
) -> None:
    """Load the worker class, check it, and run it (the options of
    :func:`_worker_options`); exits with its status."""
    try:
        settings = _settings_and_logging(log_level, log_format)
        cls = load()
        # before cls(): an abstract class would raise a TypeError with a traceback
        cls.check_configuration()
        if metrics_port is not None:
            _serve_metrics(cls, metrics_port, metrics_host, url or settings.url)
        if tracing:
            from ..ops.tracing import instrument

            instrument()
        code = cls().run(
            url,
            concurrency=concurrency,
            burst=burst,
            batch_size=batch_size,
            settings=settings,
            commit_budget_ms=commit_budget_ms,
        )
    except SqlaQueueError as exc:
        raise CommandError(str(exc)) from exc
    sys.exit(code)


def _serve_metrics(cls: type[WorkerBase], port: int, host: str, url: str | URL | None) -> None:
    from ..ops.metrics import serve

    model = cls.queue_model()
    engines: list[Engine] = []

    def states() -> dict[str, int]:
        """The totals of ``status`` (sqla_queue_tasks_in_state), on an engine of one
        connection of its own, made at the first scrape."""
        from ..ops.status import queue_status

        if not engines:
            if url is None:
                raise ConfigurationError("no database URL")
            engines.append(make_engine(url, pool_size=1))
        return queue_status(engines[0], model, running=0, failures=0).totals.as_dict()

    try:
        serve(port, host=host, queue=model.__table__.name, processes=cls.processes, states=states)
    except OSError as exc:
        raise CommandError(
            f"metrics: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    logging.getLogger("sqla_queue.worker").info("metrics on http://%s:%d/metrics", host, port)


@main.command()
@click.argument("worker")
@_worker_options
def worker(worker: str, **options: Any) -> None:
    """Run WORKER (module:Class, a WorkerBase subclass) until SIGTERM/SIGINT."""
    _run_worker(lambda: load_worker(worker), **options)


@main.command()
@click.option("--model", "model", required=True, help="the queue: module:Task (a QueueMixin model)")
@click.option(
    "--subscriber-model",
    "subscriber_model",
    required=True,
    help="its subscriptions: module:Subscriber (a SubscriberMixin model)",
)
@click.option(
    "--process",
    "processes",
    multiple=True,
    help="deliver only publications and copies of this processo (repeat for more) [default: all]",
)
@_worker_options
def webhook(model: str, subscriber_model: str, processes: tuple[str, ...], **options: Any) -> None:
    """Deliver webhooks: fan out the publications of the queue in --model and
    call each subscription's url with its copy, until SIGTERM/SIGINT.

    No code to write: the subscriber table says where (url, http_method,
    headers, signing_secret). DEFAULT_WEBHOOK_TIMEOUT (seconds, default 20)
    bounds each call; WEBHOOK_BLOCK_PRIVATE_NETWORKS=true refuses private,
    loopback and link-local destinations."""

    def load() -> type[WorkerBase]:
        attributes = {
            "__module__": __name__,
            "model": load_model(model, QueueMixin, "queue model"),
            "subscriber_model": load_model(subscriber_model, SubscriberMixin, "subscriber model"),
            "processes": frozenset(processes) or None,
        }
        return type("WorkerWebhook", (WorkerWebhook,), attributes)

    _run_worker(load, **options)


def print_ddl(schema: str, queue: str, **options: Any) -> None:
    """Print :func:`sqla_queue.alembic.ddl.queue_ddl`, a bad name as a one-line error."""
    from ..alembic.ddl import queue_ddl  # alembic, imported by this command only

    try:
        click.echo(queue_ddl(schema, queue, **options), nl=False)
    except SqlaQueueError as exc:
        raise CommandError(str(exc)) from exc


@main.command()
@click.argument("schema")
@click.argument("queue")
@click.option(
    "--dialect",
    type=click.Choice(list(DIALECTS)),
    default="postgresql",
    show_default=True,
    help="the database the SQL is for (SQLite: SCHEMA must be main)",
)
@click.option(
    "--subscribers", is_flag=True, help="also the pub/sub subscriber table, QUEUE_subscriber"
)
@click.option(
    "--config-table",
    is_flag=True,
    help="also the PEQ configuration table, SCHEMA.queue_configuration, with its rows",
)
@click.option(
    "--unique",
    is_flag=True,
    help="also QUEUE_unique, the keys of unique tasks (a model with __queue_unique__)",
)
@click.option(
    "--unique-process",
    "unique_processes",
    multiple=True,
    help="a process the model declares unique: its live-key index too (implies --unique)",
)
def ddl(
    schema: str,
    queue: str,
    dialect: str,
    subscribers: bool,
    config_table: bool,
    unique: bool,
    unique_processes: tuple[str, ...],
) -> None:
    """Print the SQL that creates queue table SCHEMA.QUEUE.

    The same tables, indexes and (PostgreSQL) NOTIFY trigger as QueueMixin,
    SubscriberMixin and ConfigurationMixin make with create_all(); the NOTIFY
    channel is QUEUE. Run it as is: psql -f, mysql <, sqlite3 DB <.
    """
    print_ddl(
        schema,
        queue,
        dialect=dialect,
        subscribers=subscribers,
        config_table=config_table,
        unique=unique,
        unique_processes=unique_processes,
    )


@main.group(name="alembic")
def alembic_group() -> None:
    """Alembic migrations for queue tables (docs/migrations.md)."""


@alembic_group.command(name="init")
@click.argument("directory")
@click.option(
    "-t",
    "--template",
    type=click.Choice(["generic", "multidb"]),
    default="generic",
    show_default=True,
    help="generic: one database; multidb: several, one section each in alembic.ini",
)
@click.option(
    "--metadata",
    metavar="MODULE:ATTRIBUTE",
    help="your models' MetaData (or declarative base), e.g. myapp.models:Base.metadata; "
    "written as target_metadata in alembic.ini",
)
@click.option(
    "-c", "--config", "config_file", default="alembic.ini", show_default=True, help="the .ini file"
)
def alembic_init(directory: str, template: str, metadata: str | None, config_file: str) -> None:
    """Make a migration environment in DIRECTORY from sqla-queue's templates.

    Like `alembic init`, with an env.py that imports your metadata and
    sqla_queue.alembic (the queue operations and their autogenerate
    comparator). Then: alembic revision --autogenerate -m "queues".
    """
    from alembic.util import CommandError as AlembicError

    from ..alembic import init

    try:
        init(directory, template, config_file=config_file, metadata=metadata)
    except AlembicError as exc:
        raise CommandError(str(exc)) from exc


@main.command()
@click.argument("worker", required=False)
@click.option("--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="interface to listen on (0.0.0.0: every one, for workers on other hosts)",
)
@click.option(
    "--notify-port",
    type=Number(LISTEN_PORT),
    help="workers' wake-ups and task locks [default: NOTIFY_SERVICE_PORT, else 8770]",
)
@click.option(
    "--lock-port",
    type=Number(LISTEN_PORT),
    help="maintenance routines' locks [default: LOCK_SERVICE_PORT, else 8970]",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="[default: INFO, DEBUG with LOG_DEBUG=true]",
)
def server(
    worker: str | None,
    url: str | None,
    host: str,
    notify_port: int | None,
    lock_port: int | None,
    log_level: str | None,
) -> None:
    """Serve wake-ups and locks to workers in client-server mode
    (docs/client-server.md). WORKER (module:Class) names the queue; without
    it, QUEUE_TABLE and QUEUE_NAME do. Needs SQLA_QUEUE_SERVER_SECRET."""
    try:
        settings = _settings_and_logging(log_level)
        from ..server.main import queue_of, serve  # only the server needs asyncio

        table, channel = queue_of(load_worker(worker) if worker else None, settings)
        code = serve(
            table,
            channel,
            url or settings.url,
            settings.server,
            host=host,
            notify_port=notify_port,
            lock_port=lock_port,
        )
    except SqlaQueueError as exc:
        raise CommandError(str(exc)) from exc
    sys.exit(code)
