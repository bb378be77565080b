"""Client-server mode: the socket server that gives workers wake-ups and
locks on databases without LISTEN/NOTIFY or advisory locks (SingleStore,
MySQL), and its clients. See docs/client-server.md."""

from __future__ import annotations

from ..common.server_protocol import ProtocolError
from ..worker.server_client import (
    ServerConnection,
    ServerRefused,
    ServerRoutineLock,
    ServerUnavailable,
    ServerWakeups,
    notify_queue,
)
from .service import QueueServer

__all__ = [
    "ProtocolError",
    "QueueServer",
    "ServerConnection",
    "ServerRefused",
    "ServerRoutineLock",
    "ServerUnavailable",
    "ServerWakeups",
    "notify_queue",
]
