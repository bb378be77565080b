"""One adapter per dialect family; :func:`adapter_for` picks it."""

from __future__ import annotations

import importlib

from sqlalchemy import Table
from sqlalchemy.engine import Dialect

from ..common.exceptions import ConfigurationError, UnsupportedOperationError
from ..common.types import dialect_family
from .base import Adapter, ClaimFilter, ErrorKind, Listener

__all__ = ["Adapter", "ClaimFilter", "ErrorKind", "Listener", "adapter_for", "adapter_of"]

# imported on first use: a worker loads only its own database's adapter
_ADAPTERS = {
    "postgresql": ("postgresql", "PostgresAdapter"),
    "mysql": ("mysql", "MySQLAdapter"),
    "singlestore": ("singlestore", "SingleStoreAdapter"),
    "sqlite": ("sqlite", "SQLiteAdapter"),
}


def adapter_for(
    dialect: Dialect | str,
    table: Table,
    channel: str,
    *,
    task_locks: bool = True,
    claim_filter: ClaimFilter | None = None,
    nsj_locks: bool = False,
    in_caller_transaction: bool = False,
    dead_peer_seconds: float | None = None,
) -> Adapter:
    """The adapter for ``dialect``'s family; ``claim_filter`` restricts what
    its claims take (a worker's processes, a pub/sub worker's subscribers).
    ``nsj_locks``: take nsj-queue-lib's task lock too, so that its workers
    and sqla-queue's can share the queue (PostgreSQL, with task locks).
    ``dead_peer_seconds``: see ``Adapter.guard_dead_peers``."""
    family = dialect_family(dialect)
    try:
        module, name = _ADAPTERS[family]
    except KeyError:
        raise UnsupportedOperationError(
            f"sqla-queue does not support the {family!r} dialect "
            "(PostgreSQL, MySQL/MariaDB, SingleStore and SQLite are supported)"
        ) from None
    if nsj_locks:
        if family != "postgresql":
            raise ConfigurationError(
                f"nsj_locks (SQLA_QUEUE_NSJ_LOCKS) is for PostgreSQL, not {family}: "
                "nsj-queue-lib's workers lock tasks with pg_try_advisory_lock there only"
            )
        if not task_locks:
            raise ConfigurationError(
                "nsj_locks (SQLA_QUEUE_NSJ_LOCKS) needs task locks: SQLA_QUEUE_TASK_LOCKS "
                "or task_locks is false (nsj-queue-lib's lock is a session-level lock too)"
            )
        module, name = "nsj", "PostgresNsjAdapter"
    cls: type[Adapter] = getattr(importlib.import_module(f".{module}", __name__), name)
    return cls(
        table,
        channel,
        task_locks=task_locks,
        claim_filter=claim_filter,
        in_caller_transaction=in_caller_transaction,
        dead_peer_seconds=dead_peer_seconds,
    )


# (dialect name, the table's id, task locks) -> the adapter adapter_of made
_shared: dict[tuple[str, int, bool], Adapter] = {}


def adapter_of(dialect: Dialect | str, table: Table, *, task_locks: bool = True) -> Adapter:
    """The one adapter per table and dialect that code outside a worker
    shares: the flush hook, :class:`~sqla_queue.QueueClient`, the inspection
    and the operator's actions. Its channel is the table's (``info``) or the
    table's name; it claims nothing, so it takes no claim filter."""
    name = dialect if isinstance(dialect, str) else dialect.name
    key = (name, id(table), task_locks)
    adapter = _shared.get(key)
    if adapter is None or adapter.table is not table:  # a reused id: a new table
        channel = table.info.get("sqla_queue", {}).get("channel") or table.name
        adapter = _shared[key] = adapter_for(dialect, table, channel, task_locks=task_locks)
    return adapter
