"""What an operator's command needs of a queue: its configuration and its adapter.

``sqla-queue cancel``, ``retry-now``, ``pause``, ``resume``, ``requeue``,
``status`` and ``dashboard`` act on rows of a worker's queue; they start
nothing and claim nothing. :class:`OperatorContext` gives them the engine,
the effective configuration (class attribute, environment,
``queue_configuration``, default) and the adapter, and no more: not the
claims, limits, fairness, stages, manager or routines that
:class:`~sqla_queue.worker.app.QueueApp` builds for a running worker (nor
their imports). ``QueueApp`` shares its table check and its reading of the
configuration table from here.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine, inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from ..adapters import Adapter, ErrorKind, adapter_for
from ..adapters.configuration import read_rows
from ..adapters.liveness import default_bound
from ..common.exceptions import ConfigurationError, WorkerDatabaseError
from ..common.redaction import redact
from ..config.resolution import Effective, resolve
from ..config.settings import Settings, make_engine
from ..config.sources import TableRow
from ..schema.configuration_table import configuration_table_of
from ..schema.mixins import channel_of
from . import providers

__all__ = ["OperatorContext", "check_table", "database_error", "describe", "read_configuration"]

logger = logging.getLogger("sqla_queue.worker")


class OperatorContext:
    """A worker class's queue as an operator's command sees it (see the
    module): ``engine`` (the given one, or made from ``url``, else from the
    settings, and disposed by :meth:`close`), ``settings``, ``effective``,
    ``configuration_rows`` and ``adapter``."""

    def __init__(
        self,
        worker_class: Any,
        *,
        url: str | URL | None = None,
        engine: Engine | None = None,
        settings: Settings | None = None,
    ) -> None:
        worker_class.check_configuration()
        self.worker_class = worker_class
        self.model = worker_class.queue_model()
        self.settings = settings or Settings.from_env()
        self._owns_engine = engine is None
        if engine is None:
            url = url or self.settings.url
            if url is None:
                raise ConfigurationError(
                    "no database: pass --url, or set SQLA_QUEUE_URL or the DB_* variables"
                )
            engine = make_engine(url)
        self.engine = engine
        #: the queue_configuration rows (None: no such table, or not read),
        #: and whether the database could not be reached to read them
        self.configuration_rows, self.configuration_unread = read_configuration(engine, self.model)
        self.effective: Effective = resolve(worker_class, self.settings, self.configuration_rows)
        self.adapter = plain_adapter(worker_class, engine, self.settings, self.effective)

    def check_table(self, *, wait_for_database: bool = False) -> None:
        """See :func:`check_table`."""
        check_table(
            self.engine,
            self.adapter,
            wait_for_database=wait_for_database,
            configuration_unread=self.configuration_unread,
        )

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()


def plain_adapter(
    worker_class: Any, engine: Engine, settings: Settings, effective: Effective
) -> Adapter:
    """The adapter of ``worker_class``'s queue on ``engine``, its locks as
    the worker's (no claim filter: an operator claims nothing), its
    engine prepared."""
    model = worker_class.queue_model()
    table = model.__table__
    bound = effective["dead_peer"]
    adapter = adapter_for(
        engine.dialect,
        table,
        channel_of(model, table),
        dead_peer_seconds=default_bound(effective["lease_seconds"])
        if bound is None
        else float(bound),
        task_locks=providers.task_locks(effective["task_locks"], settings),
        nsj_locks=settings.nsj_locks if worker_class.nsj_locks is None else worker_class.nsj_locks,
    )
    adapter.prepare_engine(engine)
    adapter.guard_dead_peers(engine, server_side=bool(effective["task_locks"]))
    return adapter


#: what the start-up line about an unreachable database adds when the
#: configuration table could not be read for it (check_table says it once)
UNREAD_CONFIGURATION = "queue_configuration not read: the environment and the defaults apply"


def read_configuration(engine: Engine, model: Any) -> tuple[dict[str, TableRow] | None, bool]:
    """The queue's queue_configuration rows (None if the table does not
    exist, or could not be read), and whether the database could not be
    reached for them: it is then waited for by run(), and the table is not
    read, which check_table says in its one line about the unreachable
    database (``configuration_unread``). Shared by :class:`OperatorContext`
    and ``QueueApp``."""
    table = configuration_table_of(model)
    try:
        with engine.connect() as conn:
            return read_rows(conn, table, queue=model.__table__.name), False
    except OperationalError:  # cannot connect: said once, by check_table
        return None, True
    except DBAPIError as exc:
        logger.warning("%s (%s)", UNREAD_CONFIGURATION, describe(exc))
        return None, False


def check_table(
    engine: Engine,
    adapter: Adapter,
    *,
    wait_for_database: bool = False,
    configuration_unread: bool = False,
) -> None:
    """Refuse to start on a queue table that does not exist, or that
    lacks sqla-queue's lease columns: every claim would fail, and the
    worker would look alive doing nothing. ``wait_for_database``: a
    database that cannot be reached yet is logged and left to the lanes
    (which wait for it), not an error."""
    table = adapter.table
    while True:
        try:
            with engine.connect() as conn:
                exists = inspect(conn).has_table(table.name, schema=table.schema)
                missing = adapter.missing_columns(conn) if exists else []
                proxied = adapter.proxied(conn)
            break
        except DBAPIError as exc:
            kind = adapter.classify(exc)
            if kind is ErrorKind.TRANSIENT:
                # SQLite's write lock held past the busy timeout by busy
                # neighbours: a lane would wait again too, never give up
                logger.warning("table check: %s; retrying", describe(exc))
                continue
            if not wait_for_database or kind is not ErrorKind.DISCONNECT:
                raise database_error(engine, exc) from exc
            unread = f"; {UNREAD_CONFIGURATION}" if configuration_unread else ""
            logger.warning("cannot reach the database yet (%s); retrying%s", describe(exc), unread)
            return
    where = engine.url.render_as_string(hide_password=True)
    if not exists:
        raise ConfigurationError(
            f"the queue table {adapter.qualified_name} does not exist in "
            f"{where}: create it (Base.metadata.create_all(engine), or a migration) "
            "or check the URL"
        )
    if missing:
        raise ConfigurationError(
            f"the queue table {adapter.qualified_name} in {where} lacks "
            f"sqla-queue's column(s) {', '.join(missing)} (a table made by "
            "nsj-queue-lib?): add them as docs/lifecycle.md#leases shows"
        )
    if proxied and adapter.task_locks:
        logger.warning(
            "%s is reached through a pooler or proxy (the server sees another client "
            "socket): the worker makes no session setting through it, but its per-task "
            "and routine locks are session locks; behind a transaction-pooling PgBouncer "
            "set SQLA_QUEUE_TASK_LOCKS=false (docs/pgbouncer.md)",
            where,
        )


def database_error(engine: Engine, error: DBAPIError) -> WorkerDatabaseError:
    """``error`` as one line naming the database (without its password)."""
    where = engine.url.render_as_string(hide_password=True)
    return WorkerDatabaseError(f"database error on {where}: {describe(error)}")


def describe(exc: DBAPIError) -> str:
    """The driver's error on one line, without SQL or parameters."""
    text = redact(str(exc.orig if exc.orig is not None else exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__
