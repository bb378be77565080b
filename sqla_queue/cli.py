"""The ``sqla-queue`` command (click: small, well kept, already the de facto
standard for Python CLIs, and testable through its runner or a subprocess)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import click

from .ddl import DIALECTS, queue_ddl
from .exceptions import SqlaQueueError, WorkerImportError
from .settings import Settings
from .worker import WorkerBase


def load_worker(spec: str) -> type[WorkerBase]:
    """``package.module:ClassName`` -> the WorkerBase subclass."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise WorkerImportError(f"give the worker as module:Class, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkerImportError(f"cannot import {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, WorkerBase)):
        raise WorkerImportError(f"{spec!r} is not a WorkerBase subclass")
    return cls


@click.group()
@click.version_option(package_name="sqla-queue")
def main() -> None:
    """Transactional job queues inside your SQLAlchemy database."""


@main.command()
@click.argument("worker")
@click.option("--url", help="SQLAlchemy database URL [default: SQLA_QUEUE_URL, else DB_*]")
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="lanes (threads) in this process",
)
@click.option("--burst", is_flag=True, help="exit 0 once no task is ready (pending and due)")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    help="most tasks per transaction (1: one task per transaction)",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="[default: INFO, DEBUG with LOG_DEBUG=true]",
)
def worker(
    worker: str,
    url: str | None,
    concurrency: int,
    burst: bool,
    batch_size: int | None,
    log_level: str | None,
) -> None:
    """Run WORKER (module:Class, a WorkerBase subclass) until SIGTERM/SIGINT."""
    try:
        settings = Settings.from_env()
        level = log_level or ("DEBUG" if settings.log_debug else "INFO")
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        cls = load_worker(worker)
        # before cls(): an abstract class would raise a TypeError with a traceback
        cls.check_configuration()
        code = cls().run(
            url, concurrency=concurrency, burst=burst, batch_size=batch_size, settings=settings
        )
    except SqlaQueueError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(code)


def print_ddl(schema: str, queue: str, **options: Any) -> None:
    """Print :func:`sqla_queue.ddl.queue_ddl`, a bad name as a one-line error."""
    try:
        click.echo(queue_ddl(schema, queue, **options), nl=False)
    except SqlaQueueError as exc:
        raise click.ClickException(str(exc)) from exc


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
def ddl(schema: str, queue: str, dialect: str, subscribers: bool, config_table: bool) -> None:
    """Print the SQL that creates queue table SCHEMA.QUEUE.

    The same tables, indexes and (PostgreSQL) NOTIFY trigger as QueueMixin,
    SubscriberMixin and ConfigurationMixin make with create_all(); the NOTIFY
    channel is QUEUE. Run it as is: psql -f, mysql <, sqlite3 DB <.
    """
    print_ddl(schema, queue, dialect=dialect, subscribers=subscribers, config_table=config_table)


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
    from alembic.util import CommandError

    from .alembic import init

    try:
        init(directory, template, config_file=config_file, metadata=metadata)
    except CommandError as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":  # pragma: no cover
    main()
