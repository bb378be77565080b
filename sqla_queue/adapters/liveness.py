"""Dead peers: how long a worker cut off by the network keeps anything.

A network partition closes nothing: the server keeps a silent worker's
sessions, with their locks and open transactions, until TCP tells it the
peer is gone, which with the operating system's keepalive defaults takes
more than two hours. A worker sets a bound instead, ``dead_peer_seconds``
(twice the lease by default; docs/lifecycle.md#network-partitions), and
each side of each of its connections gives up on a silent peer within it:

- TCP keepalive probes on an idle connection (the first after a quarter of
  the bound, then every eighth, three unanswered end it), and
  ``TCP_USER_TIMEOUT`` (the bound) for a connection with data the peer
  never acknowledged; and a connection attempt gives up after 10 s (half
  the bound, if less), so that a worker reconnects soon after the heal.
  The adapters set both on the client's socket (libpq's
  connection parameters; PyMySQL's socket) and, where the database lets a
  session choose (PostgreSQL), on the server's side of the worker's
  sessions.
- The routine lock's connection is ended by the server itself once idle
  for the bound (``idle_session_timeout``, ``wait_timeout``), whatever TCP
  says; its holder keeps it busy with a ping every quarter of the bound
  (``sqla_queue.adapters.locks``).
"""

from __future__ import annotations

import contextlib
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

__all__ = ["Keepalive", "default_bound", "keep_socket_alive", "on_new_connections", "remember"]

#: what each guarded engine's new connections get (the adapter's choice)
_GUARDS: weakref.WeakKeyDictionary[Engine, Any] = weakref.WeakKeyDictionary()


def remember(engine: Engine, guard: Any) -> bool:
    """Keep ``guard`` as what ``engine``'s new connections get, the latest
    winning; whether ``engine`` is new here (its listeners yet to add)."""
    new = engine not in _GUARDS
    _GUARDS[engine] = guard
    return new


def on_new_connections(engine: Engine, listener: Callable[..., None]) -> Callable[..., None]:
    """An event listener of ``engine`` that calls ``listener(guard, *args)``
    with the engine's latest guard (:func:`remember`); the engine is held
    weakly, so the listener keeps nothing alive."""
    ref = weakref.ref(engine)

    def listen(*args: Any) -> None:
        engine = ref()
        guard = None if engine is None else _GUARDS.get(engine)
        if guard is not None:
            listener(guard, *args)

    return listen


#: the least ``auto`` bound: the routine lock's server-side idle timeout and
#: the idle-transaction timeouts must not fire on a loaded machine's pauses
MIN_AUTO_BOUND = 10.0


def default_bound(lease_seconds: float) -> float:
    """The bound when none is set: two leases, at least ``MIN_AUTO_BOUND``."""
    return max(MIN_AUTO_BOUND, 2 * float(lease_seconds))


@dataclass(frozen=True)
class Keepalive:
    """TCP keepalive timings whose sum stays within a bound (whole seconds:
    the kernel's unit)."""

    idle: int
    interval: int
    count: int
    user_timeout_ms: int

    @classmethod
    def within(cls, seconds: float) -> Keepalive:
        idle = max(1, int(seconds // 4))
        interval = max(1, int(seconds // 8))
        count = max(1, min(3, int((seconds - idle) // interval)))
        return cls(idle, interval, count, max(1000, int(seconds * 1000)))

    @property
    def connect_timeout(self) -> int:
        """Seconds a new connection may take (a SYN into a cut is retried
        for two minutes otherwise): PyMySQL's default of 10, or less within
        a short bound."""
        return max(2, min(10, self.user_timeout_ms // 2000))

    @property
    def detects_within(self) -> int:
        """Seconds an idle connection's silent peer takes to be found."""
        return self.idle + self.interval * self.count


def keep_socket_alive(sock: Any, keepalive: Keepalive) -> bool:
    """Set ``keepalive`` on a client socket; whether it could (Linux has
    every option; elsewhere what the platform has is set)."""
    if not isinstance(sock, socket.socket) or sock.family not in (
        socket.AF_INET,
        socket.AF_INET6,
    ):
        return False
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), keepalive.idle),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), keepalive.interval),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), keepalive.count),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), keepalive.user_timeout_ms),
    ]
    for level, option, value in options:
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)
    return True
