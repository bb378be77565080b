"""Which lock and wake-up providers a worker uses, by dialect and settings.

=================  ==========================  ==========================
database           wake-ups                    per-task locks (rescue)
=================  ==========================  ==========================
PostgreSQL         LISTEN/NOTIFY               advisory locks + leases
MySQL / MariaDB    polling                     GET_LOCK + leases
SingleStore        the queue server (required) leases
SQLite             polling                     leases (one writer anyway)
any, in client-    the queue server            leases
server mode
=================  ==========================  ==========================

In client-server mode (``CLIENT_SERVER_MODE=true``) the database still makes
every claim exclusive; the server only wakes workers and grants routine
locks. Per-task database locks are off there: the rescue judges a task lost
by its lease alone, so a restart of the server (which frees every lock it
granted) never makes a running task look lost. Maintenance routines take
their locks from :func:`server_routine_lock` when it returns one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine

from ..adapters.base import Adapter, Listener
from ..common.exceptions import ConfigurationError
from ..config.settings import Settings

if TYPE_CHECKING:
    from .server_client import ServerRoutineLock

__all__ = ["check_adapter", "server_routine_lock", "task_locks", "wakeups"]


def check_adapter(adapter: Adapter, settings: Settings) -> None:
    """A database without a lock that dies with a connection and without
    NOTIFY (SingleStore) needs the queue server: refuse to start without."""
    if adapter.needs_queue_server and not settings.server.enabled:
        raise ConfigurationError(adapter.needs_queue_server)


def task_locks(requested: bool, settings: Settings) -> bool:
    """Whether claims take per-task database locks: as requested, except in
    client-server mode, where the rescue relies on leases alone."""
    return requested and not settings.server.enabled


def wakeups(
    adapter: Adapter, engine: Engine, settings: Settings, *, client_name: str
) -> Listener | None:
    """The wake-up provider: the queue server in client-server mode, else
    the database's own (LISTEN on PostgreSQL), else None (polling)."""
    if settings.server.enabled:
        from .server_client import ServerWakeups

        return ServerWakeups(settings.server, adapter.channel, client_name=client_name)
    if adapter.supports_notify:
        return adapter.listener(engine)
    return None


def server_routine_lock(settings: Settings, *, client_name: str) -> ServerRoutineLock | None:
    """The maintenance routines' lock on the queue server in client-server
    mode; None when the database's own locks serve."""
    if not settings.server.enabled:
        return None
    from .server_client import ServerRoutineLock

    return ServerRoutineLock(settings.server, client_name=client_name)
