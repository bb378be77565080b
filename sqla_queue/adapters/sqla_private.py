"""Every use of SQLAlchemy's private API, fenced in one place.

sqla-queue's fast paths reach a few names SQLAlchemy does not promise to
keep (they start with an underscore). Each is wrapped here in a small
function that says what it relies on and why; the rest of the package calls
these functions and never the private names (``tests/unit/
test_sqlalchemy_private.py`` reads the source and fails on a private name
outside this module, and checks each name's presence, signature and effect
on the installed SQLAlchemy, so a release that changes one fails there
first; CI runs it on the newest 2.0.x and on the 2.1.x of the venv).

Presence is checked once, at import (``AsyncConnection``'s at each call:
its module needs greenlet, which only async workers import). Where
sqla-queue has a safe answer without the name (the ordinary, public path),
the function gives it; otherwise it raises
:class:`~sqla_queue.common.exceptions.SQLAlchemyChangedError` on its first call,
naming the function and the SQLAlchemy version.

What is not here, because it is public or not SQLAlchemy's: the
``dispatch`` listener collections the flush hook and ``statements_unobserved``
read, ``sqlalchemy.util.await_only`` / ``greenlet_spawn`` /
``sqlalchemy.util.concurrency.in_greenlet`` (internal package, public names;
the tests check they import), and the drivers' own private attributes
(psycopg's ``_prepared``, PyMySQL's ``_sock``).
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Any, TypeVar

import sqlalchemy
from sqlalchemy import Connection, Engine
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.orm import InstanceState, Session
from sqlalchemy.pool import Pool
from sqlalchemy.sql.dml import ValuesBase
from sqlalchemy.sql.visitors import InternalTraversal

from ..common.exceptions import SQLAlchemyChangedError

__all__ = [
    "PRIVATE_NAMES",
    "async_connection_of",
    "can_register_persistent",
    "echo_on",
    "embedded_values",
    "events_flagged",
    "invalidate_pooled",
    "pool_max_overflow",
    "register_persistent",
    "traversed_clauses",
]

#: every private SQLAlchemy name this module reaches; the test fails when
#: one appears anywhere else in the package
PRIVATE_NAMES = frozenset(
    {
        "_register_persistent",
        "_invalidate",
        "_retrieve_proxy_for_target",
        "_echo",
        "_has_events",
        "_max_overflow",
        "_values",
        "_multi_values",
        "_traverse_internals",
    }
)

_C = TypeVar("_C", bound=type)

_HAS_REGISTER_PERSISTENT = callable(getattr(Session, "_register_persistent", None))
_HAS_INVALIDATE = callable(getattr(Pool, "_invalidate", None))
_HAS_EVENT_FLAGS = all(hasattr(cls, "_has_events") for cls in (Connection, Engine, DefaultDialect))
_HAS_VALUES = hasattr(ValuesBase, "_values") and hasattr(ValuesBase, "_multi_values")
_HAS_CLAUSE_TRAVERSAL = hasattr(InternalTraversal, "dp_clauseelement")


def _changed(function: str, name: str) -> SQLAlchemyChangedError:
    return SQLAlchemyChangedError(
        f"sqla-queue's {function}() relies on {name}, which SQLAlchemy "
        f"{sqlalchemy.__version__} does not have (sqla_queue/adapters/sqla_private.py)"
    )


def can_register_persistent() -> bool:
    """Whether :func:`register_persistent` can run: the flush hook's fast
    path (``flush_insert.py``) takes a model only then, and leaves its tasks
    to the ordinary flush otherwise."""
    return _HAS_REGISTER_PERSISTENT


def register_persistent(session: Session, states: Set[InstanceState[Any]]) -> None:
    """Make ``states``, pending objects whose rows the caller inserted, persistent
    in ``session`` as its flush would: in the identity map and the
    transaction's new objects (a rollback expunges them), history committed,
    ``pending_to_persistent`` fired. ``Session._register_persistent`` is the
    step of the flush that does exactly this; no public call does."""
    if not _HAS_REGISTER_PERSISTENT:
        raise _changed("register_persistent", "Session._register_persistent")
    session._register_persistent(states)  # type: ignore[arg-type]


def invalidate_pooled(conn: Connection, exc: BaseException) -> None:
    """Invalidate ``conn``'s pooled connection after ``exc`` (a disconnect
    seen on its DBAPI connection outside ``conn.execute``), with the pool's
    older connections, as ``conn.execute`` does on a disconnect:
    ``Pool._invalidate`` is that step; ``Connection.invalidate`` alone
    leaves the older connections in the pool."""
    if not _HAS_INVALIDATE:
        raise _changed("invalidate_pooled", "Pool._invalidate")
    conn.engine.pool._invalidate(conn.connection, exc)


def async_connection_of(sync_connection: Any) -> Any:
    """The ``AsyncConnection`` of ``sync_connection`` (a connection of an
    async engine's ``sync_engine``), made if it has none yet:
    ``AsyncConnection._retrieve_proxy_for_target``, how SQLAlchemy itself
    goes from the sync side back to the async one. Checked on each call:
    ``sqlalchemy.ext.asyncio`` needs greenlet, which only async workers
    import."""
    from sqlalchemy.ext.asyncio import AsyncConnection

    retrieve = getattr(AsyncConnection, "_retrieve_proxy_for_target", None)
    if retrieve is None:
        raise _changed("async_connection_of", "AsyncConnection._retrieve_proxy_for_target")
    return retrieve(sync_connection)


def echo_on(conn: Connection) -> bool:
    """Whether ``conn`` logs its statements (``Connection._echo``, which
    ``conn.execute`` reads); True when the attribute is missing: the caller
    then takes the public path."""
    return bool(getattr(conn, "_echo", True))


def events_flagged(conn: Connection) -> bool:
    """Whether an event listener may be on ``conn``, its engine or its
    dialect: their ``_has_events``, SQLAlchemy's own "anything listening at
    all" flags (set by any ``event.listen`` on them), read before the
    listener collections themselves on every enqueue's path. True when a
    flag is missing: the caller then looks at the listeners."""
    return bool(
        not _HAS_EVENT_FLAGS
        or getattr(conn, "_has_events", True)
        or getattr(conn.engine, "_has_events", True)
        or getattr(conn.dialect, "_has_events", True)
    )


def pool_max_overflow(pool: Pool) -> int | None:
    """The ``max_overflow`` a ``QueuePool`` was built with (-1: unbounded),
    None for a pool without one: ``QueuePool`` keeps it only as
    ``_max_overflow`` (its public ``overflow()`` is the current overflow)."""
    overflow = getattr(pool, "_max_overflow", None)
    return overflow if isinstance(overflow, int) else None


def embedded_values(statement: Any) -> Any:
    """The values an INSERT or UPDATE carries in itself (``.values()``, one
    row or many), as opposed to the parameters it is executed with; empty
    when it has none. ``ValuesBase._values`` / ``_multi_values`` hold them;
    SQLAlchemy exposes no public reading of them."""
    if not _HAS_VALUES:
        raise _changed("embedded_values", "ValuesBase._values / _multi_values")
    return getattr(statement, "_values", None) or getattr(statement, "_multi_values", None) or ()


def traversed_clauses(*names: str) -> Callable[[_C], _C]:
    """Class decorator for a custom ``ColumnElement`` with ``inherit_cache``:
    its attributes ``names`` (SQL clauses) take part in its cache key. A
    statement holding it is then cached per clause, not once for all.
    ``_traverse_internals`` is how SQLAlchemy's own elements declare this;
    without it the element has no cache key, and its statements are not
    cached at all."""
    if not _HAS_CLAUSE_TRAVERSAL:
        raise _changed("traversed_clauses", "InternalTraversal.dp_clauseelement")

    def declare(cls: _C) -> _C:
        cls._traverse_internals = [(name, InternalTraversal.dp_clauseelement) for name in names]  # type: ignore[attr-defined]
        return cls

    return declare
