"""``AsyncQueueClient``: :class:`~sqla_queue.QueueClient` for async code.

SQLAlchemy's asyncio layer is a facade: an ``AsyncSession`` drives a plain
``Session`` (its ``sync_session``), an ``AsyncConnection`` a plain
``Connection``, and ``run_sync(fn)`` runs ``fn`` on them in a greenlet
whose blocking calls become awaits on the async driver. So this client
holds a ``QueueClient`` built on that sync facade and runs each call through
``run_sync``: the same statements, the same admission of unique tasks, the
same results and errors, in the caller's transaction, nothing committed.

    async with session_factory() as session, session.begin():
        session.add(Invoice(number=7))
        client = AsyncQueueClient(session, "fila_faturamento")
        await client.insert_task("erp", "sefaz", "faturar", "7", {"invoice": 7})

The ORM path needs no client: ``install(AsyncSession)`` (or an
``async_sessionmaker``) and ``session.add(Task(...))`` (docs/async.md).
Importing this module imports ``sqlalchemy.ext.asyncio``, which needs
greenlet; ``import sqla_queue`` does not import it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Table
from sqlalchemy.orm import Session

from ..common.exceptions import ConfigurationError
from ..schema.mixins import QueueMixin
from ..schema.records import TaskRecord
from .queue import DEFAULT_EQUIVALENT_STATUSES, QueueClient, _constructor_arguments

try:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
except ImportError as exc:  # greenlet
    raise ImportError(
        "AsyncQueueClient needs greenlet, SQLAlchemy's bridge to asyncio, which cannot be "
        "imported: pip install 'sqla-queue[postgresql]' (or [mysql], [sqlite]: each installs "
        "it with its async driver)"
    ) from exc

if TYPE_CHECKING:
    from ..common.progress import Progress
    from .requeue import Requeued
    from .workflow import Workflow

__all__ = ["AsyncQueueClient"]

_T = TypeVar("_T")


class AsyncQueueClient:
    """Enqueue on ``session_or_connection`` (an AsyncSession or a connected
    AsyncConnection) into ``table`` (a model, a Table, or a table
    name, optionally ``schema.table``). The arguments and the methods are
    :class:`~sqla_queue.QueueClient`'s, each method a coroutine."""

    def __init__(
        self,
        session_or_connection: AsyncSession | AsyncConnection | None = None,
        table: str | type[QueueMixin] | Table | None = None,
        subscriber_table: str | None = None,
        *,
        bd_conn: AsyncSession | AsyncConnection | None = None,
        queue_table: str | type[QueueMixin] | Table | None = None,
        queue_subscriber_table: str | None = None,
    ) -> None:
        conn, queue, subscribers = _constructor_arguments(
            "AsyncQueueClient",
            "an AsyncSession or AsyncConnection",
            (session_or_connection, table, subscriber_table),
            (bd_conn, queue_table, queue_subscriber_table),
        )
        self.session_or_connection: AsyncSession | AsyncConnection = conn
        self._client = QueueClient(_sync_facade(conn), queue, subscribers)
        self.table = self._client.table
        self.subscriber_table = self._client.subscriber_table

    @property
    def bd_conn(self) -> AsyncSession | AsyncConnection:
        """nsj-queue-lib's name for :attr:`session_or_connection`."""
        return self.session_or_connection

    async def connection(self) -> AsyncConnection:
        """The AsyncConnection the tasks are written on (the session's, begun
        if it was not): a coroutine, as ``AsyncSession.connection()`` is,
        where ``QueueClient.connection`` is a property."""
        conn = self.session_or_connection
        return await conn.connection() if isinstance(conn, AsyncSession) else conn

    async def _run(self, call: Callable[[QueueClient], _T]) -> _T:
        client = self._client
        # run_sync hands over the sync facade, the one the client was built on
        return await self.session_or_connection.run_sync(lambda _: call(client))

    # ------------------------------------------------------------- inserts
    async def insert_task(self, *args: Any, **kwargs: Any) -> int:
        """:meth:`QueueClient.insert_task <sqla_queue.QueueClient.insert_task>`."""
        return await self._run(lambda client: client.insert_task(*args, **kwargs))

    async def insert_task_pub_sub(self, *args: Any, **kwargs: Any) -> int:
        """:meth:`QueueClient.insert_task_pub_sub <sqla_queue.QueueClient.insert_task_pub_sub>`."""
        return await self._run(lambda client: client.insert_task_pub_sub(*args, **kwargs))

    async def insert_task_webhook(self, *args: Any, **kwargs: Any) -> int:
        """:meth:`QueueClient.insert_task_webhook <sqla_queue.QueueClient.insert_task_webhook>`."""
        return await self._run(lambda client: client.insert_task_webhook(*args, **kwargs))

    async def insert_tasks(
        self, tasks: Iterable[Mapping[str, Any]], *, pub_sub: bool = False
    ) -> list[int]:
        """:meth:`QueueClient.insert_tasks <sqla_queue.QueueClient.insert_tasks>`."""
        return await self._run(lambda client: client.insert_tasks(tasks, pub_sub=pub_sub))

    async def copy_tasks(
        self, tasks: Iterable[Mapping[str, Any]], *, pub_sub: bool = False
    ) -> list[int]:
        """:meth:`QueueClient.copy_tasks <sqla_queue.QueueClient.copy_tasks>`
        (PostgreSQL's COPY, through psycopg's async mode here)."""
        return await self._run(lambda client: client.copy_tasks(tasks, pub_sub=pub_sub))

    # ------------------------------------------------------------- dead letter
    async def requeue_dead(
        self,
        ids: Iterable[int] | None = None,
        *,
        process: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        all_dead: bool = False,
        limit: int = 10_000,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> list[Requeued]:
        """:meth:`QueueClient.requeue_dead <sqla_queue.QueueClient.requeue_dead>`;
        ``progress`` is called in the greenlet that runs the statements: it
        must not block."""
        return await self._run(
            lambda client: client.requeue_dead(
                ids,
                process=process,
                since=since,
                until=until,
                all_dead=all_dead,
                limit=limit,
                dry_run=dry_run,
                progress=progress,
            )
        )

    # ------------------------------------------------------------- operator
    async def cancel(self, task_id: int) -> list[int]:
        """:meth:`QueueClient.cancel <sqla_queue.QueueClient.cancel>`."""
        return await self._run(lambda client: client.cancel(task_id))

    async def cancel_process(
        self, process: str, *, older_than: dt.timedelta | None = None, limit: int = 1_000
    ) -> list[int]:
        """:meth:`QueueClient.cancel_process <sqla_queue.QueueClient.cancel_process>`."""
        return await self._run(
            lambda client: client.cancel_process(process, older_than=older_than, limit=limit)
        )

    async def enqueue_workflow(self, workflow: Workflow, **options: Any) -> int:
        """:meth:`QueueClient.enqueue_workflow <sqla_queue.QueueClient.enqueue_workflow>`:
        ``await workflow.enqueue_async(session, **options)`` on this
        client's AsyncSession."""
        return await self._run(lambda client: client.enqueue_workflow(workflow, **options))

    async def cancel_workflow(self, workflow_id: int) -> list[int]:
        """:meth:`QueueClient.cancel_workflow <sqla_queue.QueueClient.cancel_workflow>`."""
        return await self._run(lambda client: client.cancel_workflow(workflow_id))

    async def retry_now(self, task_id: int) -> int:
        """:meth:`QueueClient.retry_now <sqla_queue.QueueClient.retry_now>`."""
        return await self._run(lambda client: client.retry_now(task_id))

    # ------------------------------------------------------------- queries
    async def list_equivalent_task(
        self, *args: Any, status: Sequence[str] = DEFAULT_EQUIVALENT_STATUSES, **kwargs: Any
    ) -> list[TaskRecord]:
        """:meth:`QueueClient.list_equivalent_task
        <sqla_queue.QueueClient.list_equivalent_task>`."""
        return await self._run(
            lambda client: client.list_equivalent_task(*args, status=status, **kwargs)
        )


def _sync_facade(conn: Any) -> Session | Connection:
    """The Session or Connection that ``conn``'s ``run_sync`` hands over."""
    if isinstance(conn, AsyncSession):
        return conn.sync_session
    if isinstance(conn, AsyncConnection):
        if conn.sync_connection is None:
            raise ConfigurationError(
                "AsyncQueueClient needs a connected AsyncConnection: "
                "async with engine.connect() as conn (or engine.begin())"
            )
        return conn.sync_connection
    module = type(conn).__module__
    raise ConfigurationError(
        "AsyncQueueClient needs a SQLAlchemy AsyncSession or AsyncConnection, "
        f"not {module}.{type(conn).__qualname__}"
        + (": use sqla_queue.QueueClient" if isinstance(conn, (Session, Connection)) else "")
    )
