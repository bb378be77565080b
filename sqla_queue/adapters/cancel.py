"""Cancelling a running statement from another thread, per dialect (the
time limits' way to stop an abandoned handler's SQL: ``timelimit.py``).

Module functions rather than adapter methods: the connection may be a
tenant database's, of another dialect than the queue's.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Connection, text

from ..common.redaction import describe_error

__all__ = ["interrupt_ended_transaction", "interrupt_statement", "was_cancelled"]

logger = logging.getLogger("sqla_queue.worker")


def interrupt_statement(conn: Connection) -> None:
    """Cancel the statement ``conn`` is running, from another thread."""
    dialect = conn.dialect.name
    try:
        dbapi_conn: Any = conn.connection.dbapi_connection
        if dialect == "postgresql":
            dbapi_conn.cancel()
        elif dialect in ("mysql", "mariadb"):
            thread_id = int(dbapi_conn.thread_id())
            with conn.engine.connect() as other:
                other.execute(text(f"KILL QUERY {thread_id}"))
        elif dialect == "sqlite":
            # Never leave a SQLite statement running: the batch transaction
            # holds the database's write lock, and an abandoned connection
            # cannot even be closed (close waits for the statement), so every
            # other writer (the failure's record, the rescue, the heartbeat,
            # the application) would get "database is locked" until it ends.
            # sqlite3_interrupt is safe from another thread.
            dbapi_conn.interrupt()
    except Exception as exc:  # the statement ended, or the connection did
        logger.debug("could not cancel the handler's statement: %s", describe_error(exc))


def interrupt_ended_transaction(conn: Connection) -> bool:
    """Whether the cancelled statement ended ``conn``'s transaction: SQLite
    rolls back the whole transaction of an interrupted INSERT, UPDATE or
    DELETE (the savepoints with it), and later statements would each commit
    on their own. Elsewhere a cancelled statement leaves the transaction to
    the savepoint's rollback."""
    if conn.dialect.name != "sqlite":
        return False
    try:
        return not conn.connection.dbapi_connection.in_transaction  # type: ignore[union-attr]
    except Exception:  # the connection is gone: its transaction too
        return True


def was_cancelled(exc: BaseException) -> bool:
    """A driver error saying the statement was cancelled (by us)."""
    orig = getattr(exc, "orig", exc)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate == "57014":  # query_canceled
        return True
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        import sqlite3  # loaded already: the error is its own; not in every worker

        return bool(code == sqlite3.SQLITE_INTERRUPT)
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] in (1317, 1927)  # query interrupted / connection killed
