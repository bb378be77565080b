"""The webhook delivery's transport: ``requests`` over urllib3 connections
that go only where the guard said, and never past the delivery's deadline.

:class:`WebhookClient <sqla_queue.webhooks.WebhookClient>` makes each
request inside a :class:`Call` (a context variable of the delivering
thread). The connection classes mounted on its session read it:

- **Pinned addresses.** With the guard on, a new connection goes to the
  addresses the guard resolved and checked, never to a second DNS answer
  (DNS rebinding), and only when urllib3's own idea of the host and port is
  the one the guard checked (a URL read differently by two parsers goes
  nowhere). TLS keeps the name: SNI and the certificate check use the URL's
  host, not the address.
- **A wall-clock deadline.** urllib3's timeouts bound each wait on the
  socket; an endpoint that drips a byte a second never trips them. A
  watchdog thread shuts down the sockets of a call whose deadline has
  passed, so whatever read is blocked returns at once.
- **Masked logs.** urllib3 logs each request's path and query at DEBUG; a
  filter on its loggers masks them (and the subscription's header values)
  in records emitted during a call. Other users of urllib3 in the process
  are left alone.

Through a proxy from the environment (``HTTPS_PROXY``), connections go to
the proxy: the guard checked the name locally, the proxy resolves it.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util.connection import create_connection

from .webhook_guard import Destination, Refused

__all__ = ["Call", "PinnedAdapter", "calling"]

#: urllib3's loggers that quote a request's URL
_URLLIB3_LOGGERS = (
    "urllib3.connectionpool",
    "urllib3.connection",
    "urllib3.poolmanager",
    "urllib3.response",
    "urllib3.util.retry",
)


class Call:
    """One delivery in flight: where its connections may go, until when,
    and what its log lines must not show."""

    def __init__(self, deadline: float, mask: Callable[[str], str]) -> None:
        self.deadline = deadline
        self.mask = mask
        #: the host and port the guard checked for the current request
        self.destination: Destination | None = None
        #: the checked addresses to connect to (None: urllib3 resolves)
        self.addresses: list[str] | None = None
        self.expired = False
        self._done = False
        self._connections: list[HTTPConnection] = []

    def watch(self, conn: HTTPConnection) -> None:
        with _OWNERS:
            conn._sqla_queue_call = self  # type: ignore[attr-defined]
            if self.expired:
                _shut(conn)
            else:
                self._connections.append(conn)

    def expire(self) -> None:
        """The deadline passed: end every read of this call now."""
        with _OWNERS:
            if self._done:
                return
            self.expired = True
            for conn in self._connections:
                # a connection back in the pool may serve another call by now
                if getattr(conn, "_sqla_queue_call", None) is self:
                    _shut(conn)

    def finish(self) -> None:
        with _OWNERS:
            self._done = True
            self._connections.clear()


_OWNERS = threading.Lock()
_current: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "sqla_queue_webhook_call", default=None
)


def _shut(conn: HTTPConnection) -> None:
    sock = conn.sock
    if sock is None:
        return
    # socket.socket's own shutdown, also for a TLS socket: a blocked read in
    # the delivering thread returns, and the TLS state is left alone
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread for every call of the process: expires each call at its
    deadline. Finished calls stay in the heap until then (expire is a no-op)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Call]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, call: Call) -> None:
        with self._cond:
            heapq.heappush(self._heap, (call.deadline, next(self._order), call))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sqla-queue-webhook-deadline", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    heapq.heappop(self._heap)[2].expire()
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


_WATCHDOG = _Watchdog()


@contextmanager
def calling(call: Call) -> Iterator[Call]:
    """Make the requests of this thread inside ``call``."""
    _WATCHDOG.add(call)
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)
        call.finish()


class GuardedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        call = _current.get()
        if call is None:
            return super()._new_conn()
        self._check(call)
        if call.addresses is None:
            return super()._new_conn()
        destination = call.destination
        if destination is None or (self.host.lower(), self.port) != (
            destination.host.rstrip("."),
            destination.port,
        ):
            # what urllib3 would connect to is not what the guard checked
            raise Refused(
                "destination refused: the connection's host is not the one that was checked"
            )
        error: OSError | None = None
        for address in call.addresses:
            try:
                sock = create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:
                raise ConnectTimeoutError(
                    self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
                ) from exc
            except OSError as exc:
                error = exc
                continue
            return sock
        raise NewConnectionError(self, f"Failed to establish a new connection: {error}")

    def _check(self, call: Call) -> None:
        call.watch(self)
        if call.expired:
            raise ConnectTimeoutError(self, "the delivery's deadline passed")

    def request(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        call = _current.get()
        if call is not None:
            self._check(call)
        super().request(*args, **kwargs)


class GuardedHTTPSConnection(GuardedHTTPConnection, HTTPSConnection):
    pass


class GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


class PinnedAdapter(HTTPAdapter):
    """``requests``' adapter with the guarded connections (direct and through
    a proxy: the deadline holds for both)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": GuardedHTTPConnectionPool,
            "https": GuardedHTTPSConnectionPool,
        }

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = {
            "http": GuardedHTTPConnectionPool,
            "https": GuardedHTTPSConnectionPool,
        }
        return manager


class _MaskDuringCalls(logging.Filter):
    """Masks what a call hides in urllib3's records emitted during the call."""

    def filter(self, record: logging.LogRecord) -> bool:
        call = _current.get()
        if call is not None:
            record.msg = call.mask(record.getMessage())
            record.args = None
        return True


_FILTER = _MaskDuringCalls()
for _name in _URLLIB3_LOGGERS:
    _logger = logging.getLogger(_name)
    if _FILTER not in _logger.filters:
        _logger.addFilter(_FILTER)
