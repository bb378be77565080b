"""The webhook delivery's transport: ``requests`` over urllib3 connections
that go only where the guard said, and never past the delivery's deadline.

:class:`WebhookClient <sqla_queue.webhooks.delivery.WebhookClient>` makes each
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
  passed, so whatever wait is blocked (connect, TLS handshake, sending,
  status line, headers, body) returns at once. It holds the sockets
  themselves, not the connections: with HTTP/1.0, ``Connection: close`` or
  a body read to the end of the stream, http.client hands the socket from
  the connection to the response, and the watchdog still finds it (during
  a TLS handshake, through a copy of the descriptor). A shut socket reads
  as the end of the stream, which can look like the end of a response: a
  response is complete only when :meth:`Call.in_time` says it ended before
  the deadline.
- **A complete head.** http.client takes the end of the stream inside the
  status line or the headers for their end; here that is an error
  (:class:`IncompleteHead`), never a response.
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
import http.client
import itertools
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util.connection import create_connection

from .guard import Destination, Refused

__all__ = ["Call", "IncompleteHead", "PinnedAdapter", "calling"]

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
        #: the deadline passed (set by the watchdog before it shuts the sockets)
        self.expired = False
        self._done = False
        self._sockets: list[Any] = []

    def watch(self, sock: Any) -> None:
        """Make ``sock`` this call's: the watchdog shuts it down at the
        deadline (at once when the deadline has passed already). A socket
        back in the pool that another call takes is that call's from then on."""
        with _OWNERS:
            _OWNER[sock] = self
            if not any(known is sock for known in self._sockets):
                self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def forget(self, sock: Any) -> None:
        with _OWNERS:
            if _OWNER.get(sock) is self:
                del _OWNER[sock]
            self._sockets = [known for known in self._sockets if known is not sock]

    def expire(self) -> None:
        """The deadline passed: end every wait of this call now."""
        with _OWNERS:
            if self._done:
                return
            self.expired = True
            for sock in self._sockets:
                # a socket back in the pool may serve another call by now
                if _OWNER.get(sock) is self:
                    _shut(sock)

    def in_time(self) -> bool:
        """A response was read to its end: whether that end came before the
        deadline. A socket the watchdog shut reads as the end of the stream,
        so a response that ends after the deadline is not complete, whatever
        it looks like. The call's sockets are given up (their connection may
        go back to the pool and serve another call; a next request of this
        call takes them again)."""
        with _OWNERS:
            if time.monotonic() >= self.deadline:
                self.expired = True
            self._disown()
            return not self.expired

    def finish(self) -> None:
        with _OWNERS:
            self._done = True
            self._disown()

    def _disown(self) -> None:
        for sock in self._sockets:
            if _OWNER.get(sock) is self:
                del _OWNER[sock]
        self._sockets = []


_OWNERS = threading.Lock()
#: each watched socket's call (a socket is in one call at a time)
_OWNER: weakref.WeakKeyDictionary[Any, Call] = weakref.WeakKeyDictionary()
_current: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "sqla_queue_webhook_call", default=None
)


def _shut(sock: Any) -> None:
    # urllib3's SSLTransport (TLS through a TLS proxy) wraps the socket
    while not isinstance(sock, socket.socket):
        sock = getattr(sock, "socket", None)
        if sock is None:
            return
    # socket.socket's own shutdown, also for a TLS socket: a blocked wait in
    # the delivering thread returns, and the TLS state is left alone. A
    # closed socket object has no descriptor any more (EBADF): never another
    # connection's.
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


class IncompleteHead(http.client.RemoteDisconnected):
    """The connection ended inside the response's status line or headers."""


class _HeadReader:
    """A response's file while http.client reads the head: notes a line
    that ends without its line feed (the stream ended inside the head)."""

    def __init__(self, fp: Any) -> None:
        self._fp = fp
        self.cut = False

    def readline(self, limit: int = -1) -> bytes:
        line: bytes = self._fp.readline(limit)
        if not line.endswith(b"\n"):
            self.cut = True
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fp, name)


class _Response(http.client.HTTPResponse):
    """http.client's response, refusing a head the stream cut short (which
    http.client reads as complete: a status line, the headers before the
    cut, and a body from there)."""

    def begin(self) -> None:
        if self.headers is not None:
            return
        fp = self.fp
        reader = _HeadReader(fp)
        self.fp = reader  # type: ignore[assignment]
        try:
            super().begin()
        finally:
            if self.fp is reader:  # type: ignore[comparison-overlap]
                self.fp = fp
        if reader.cut:
            raise IncompleteHead(
                "the connection ended inside the response's status line or headers"
            )


class GuardedHTTPConnection(HTTPConnection):
    response_class = _Response

    def _new_conn(self) -> socket.socket:
        call = _current.get()
        if call is None:
            return super()._new_conn()
        self._check(call)
        # with the guard on, to the addresses it checked
        sock = super()._new_conn() if call.addresses is None else self._pinned(call)
        call.watch(sock)
        return sock

    def _pinned(self, call: Call) -> socket.socket:
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
        for address in call.addresses or ():
            try:
                return create_connection(
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
        raise NewConnectionError(self, f"Failed to establish a new connection: {error}")

    def _check(self, call: Call) -> None:
        if call.expired:
            raise ConnectTimeoutError(self, "the delivery's deadline passed")

    def connect(self) -> None:
        super().connect()
        call = _current.get()
        if call is not None and self.sock is not None:
            # for TLS, the socket that wraps the one _new_conn made
            call.watch(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        call = _current.get()
        if call is not None:
            self._check(call)
            if self.sock is not None:  # a connection from the pool
                call.watch(self.sock)
        super().request(*args, **kwargs)


class GuardedHTTPSConnection(GuardedHTTPConnection, HTTPSConnection):
    _handshake_copy: socket.socket | None = None

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        call = _current.get()
        if call is not None:
            # ssl detaches this socket object from its descriptor when it
            # wraps it: during the handshake the watchdog shuts the
            # connection through a copy of the descriptor (ours: never
            # another connection's), closed when connect() ends
            self._handshake_copy = copy = sock.dup()
            call.watch(copy)
        return sock

    def connect(self) -> None:
        try:
            super().connect()
        finally:
            copy, self._handshake_copy = self._handshake_copy, None
            if copy is not None:
                call = _current.get()
                if call is not None:
                    call.forget(copy)
                copy.close()


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
