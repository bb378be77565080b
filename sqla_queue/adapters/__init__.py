"""One adapter per dialect family; :func:`adapter_for` picks it."""

from __future__ import annotations

import importlib

from sqlalchemy import Table
from sqlalchemy.engine import Dialect

from ..exceptions import UnsupportedOperationError
from ..types import dialect_family
from .base import Adapter, ClaimFilter, Listener

__all__ = ["Adapter", "ClaimFilter", "Listener", "adapter_for"]

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
) -> Adapter:
    """The adapter for ``dialect``'s family; ``claim_filter`` restricts what
    its claims take (a worker's processes, a pub/sub worker's subscribers)."""
    family = dialect_family(dialect)
    try:
        module, name = _ADAPTERS[family]
    except KeyError:
        raise UnsupportedOperationError(
            f"sqla-queue does not support the {family!r} dialect "
            "(PostgreSQL, MySQL/MariaDB, SingleStore and SQLite are supported)"
        ) from None
    cls: type[Adapter] = getattr(importlib.import_module(f".{module}", __name__), name)
    return cls(table, channel, task_locks=task_locks, claim_filter=claim_filter)
