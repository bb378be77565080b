"""The ``sqla-queue`` command (click: small, well kept, already the de facto
standard for Python CLIs, and testable through its runner or a subprocess)."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from .exceptions import SqlaQueueError, WorkerImportError
from .settings import Settings
from .spark.cli import spark
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


main.add_command(spark)


if __name__ == "__main__":  # pragma: no cover
    main()
