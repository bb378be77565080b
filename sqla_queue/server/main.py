"""``sqla-queue server``: the queue server as a process.

It serves one queue: a worker class's model, or the table that
``QUEUE_TABLE`` names (``QUEUE_NAME`` naming its channel, as in the seed).
The database is read for one thing only, whether the queue has ready tasks,
on a pool of one connection; a database that is away is logged and looked
at again at the next interval, and the sockets go on serving meanwhile.
SIGTERM or SIGINT closes every connection (freeing their locks) and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from sqlalchemy import Engine, Table
from sqlalchemy.engine import URL

from ..adapters import adapter_for
from ..client.queue import resolve_table
from ..common.exceptions import ConfigurationError
from ..common.identifiers import validate_identifier
from ..config.settings import ServerSettings, Settings, make_engine
from ..schema.mixins import channel_of
from ..worker import WorkerBase
from .service import QueueServer

__all__ = ["queue_of", "serve"]

logger = logging.getLogger("sqla_queue.server")


def queue_of(worker: type[WorkerBase] | None, settings: Settings) -> tuple[Table, str]:
    """The queue table and channel: ``worker``'s model's, else QUEUE_TABLE's
    (with QUEUE_NAME as its channel when set)."""
    if worker is not None:
        model = worker.queue_model()
        table: Table = model.__table__  # type: ignore[attr-defined]
        return table, channel_of(model, table)
    if settings.queue_table is None:
        raise ConfigurationError(
            "which queue? give a worker as module:Class, or set QUEUE_TABLE (and QUEUE_NAME)"
        )
    table = resolve_table(settings.queue_table)
    channel = settings.queue_name or table.info.get("sqla_queue", {}).get("channel") or table.name
    return table, validate_identifier(channel, "QUEUE_NAME")


def _engine(url: str | URL | None) -> Engine:
    if url is None:
        raise ConfigurationError(
            "no database: pass --url, or set SQLA_QUEUE_URL or the DB_* variables"
        )
    return make_engine(url, pool_size=1, max_overflow=0)  # one look at a time


def serve(
    table: Table,
    channel: str,
    url: str | URL | None,
    settings: ServerSettings,
    *,
    host: str,
    notify_port: int | None = None,
    lock_port: int | None = None,
) -> int:
    """Run the server until SIGTERM or SIGINT; the exit status."""
    settings.secret_bytes()  # before anything else: a server without it serves nobody
    engine = _engine(url)
    adapter = adapter_for(engine.dialect, table, channel, task_locks=False)

    def ready() -> bool:
        with engine.connect() as conn:
            return adapter.task_ready_exists(conn)

    server = QueueServer(
        settings,
        channel=channel,
        ready_check=ready,
        host=host,
        notify_port=notify_port,
        lock_port=lock_port,
    )
    if server.ports["notify"] == server.ports["lock"] != 0:
        raise ConfigurationError("the notify port and the lock port must differ")
    try:
        asyncio.run(_run(server, engine))
    finally:
        engine.dispose()
    return 0


async def _run(server: QueueServer, engine: Engine) -> None:
    try:
        ports = await server.start()
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {server.host}: {exc.strerror or exc}") from None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    logger.info(
        "serving queue %s (%s) on %s: notify port %d, lock port %d, %s",
        server.channel,
        engine.url.render_as_string(hide_password=True),
        server.host,
        ports["notify"],
        ports["lock"],
        "TLS" if server.settings.tls_cert else "no TLS",
    )
    await server.run()
    logger.info("server stopped")
