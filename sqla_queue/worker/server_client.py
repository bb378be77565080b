"""Clients of the queue server: the workers' wake-ups and routine locks.

Workers are threads, so these clients are plain blocking sockets:

- :class:`ServerWakeups` is the worker's wake-up provider in client-server
  mode (a :class:`~sqla_queue.adapters.Listener`): one connection to the
  notify port, subscribed to the queue, read by a thread that sets the
  lanes' wake event on every ``wake``. When the server goes away the lanes
  poll the database (``SQLA_QUEUE_POLL_INTERVAL``) and the thread reconnects
  with a growing delay; on reconnect it wakes the lanes, since tasks may have
  arrived meanwhile. A wrong secret or another queue's server is a
  configuration error: at start it stops the worker with one line.
- :class:`ServerRoutineLock` implements the maintenance routines'
  ``RoutineLock`` protocol (``try_acquire(name) -> bool``, ``release(name)``)
  on the lock port. A server that cannot be reached grants nothing: the
  routine skips its turn, it never runs unguarded.
- :func:`notify_queue` wakes a queue's workers at once, for an application
  that has just committed tasks and does not want to wait for the server's
  next look at the queue.

Nothing here decides which worker runs a task: claims are exclusive in the
database, so a lost server only delays tasks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import ssl
import threading
import time
from typing import Any

from ..adapters import Listener
from ..adapters.base import Wake
from ..common.exceptions import ConfigurationError, SqlaQueueError
from ..common.redaction import describe_error
from ..common.server_protocol import HEADER, body_length, decode_body, encode, lock_name, mac
from ..config.settings import ServerSettings

__all__ = [
    "ServerConnection",
    "ServerRefused",
    "ServerRoutineLock",
    "ServerUnavailable",
    "ServerWakeups",
    "notify_queue",
]

logger = logging.getLogger("sqla_queue.worker.server_client")

RECONNECT_MIN_SECONDS = 0.2
RECONNECT_MAX_SECONDS = 5.0


class ServerUnavailable(SqlaQueueError):
    """The queue server cannot be reached, or the connection to it was lost."""


class ServerRefused(ConfigurationError):
    """The queue server refused this client (a wrong secret, another queue)."""


class ServerConnection:
    """One authenticated connection to the server (blocking)."""

    def __init__(self, sock: socket.socket, where: str, timeout: float) -> None:
        self._sock = sock
        self.where = where
        self.timeout = timeout
        self.queue: str | None = None
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()

    @classmethod
    def open(cls, settings: ServerSettings, port: int, *, client_name: str) -> ServerConnection:
        secret = settings.secret_bytes()
        where = f"{settings.host}:{port}"
        timeout = settings.message_timeout_seconds
        try:
            sock = socket.create_connection((settings.host, port), timeout=timeout)
        except OSError as exc:
            raise ServerUnavailable(
                f"cannot reach the queue server at {where}: {describe_error(exc)}"
            ) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if settings.tls:
                sock = _client_ssl_context(settings).wrap_socket(
                    sock, server_hostname=settings.host
                )
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ServerUnavailable(
                f"TLS with the queue server at {where} failed: {describe_error(exc)}"
            ) from None
        conn = cls(sock, where, timeout)
        try:
            conn._handshake(secret, client_name)
        except BaseException:
            conn.close()
            raise
        return conn

    def _handshake(self, secret: bytes, client_name: str) -> None:
        challenge = self.receive(first_byte_timeout=self.timeout)
        nonce = challenge.get("nonce")
        if challenge["op"] == "error":
            raise ServerUnavailable(f"the queue server at {self.where}: {challenge.get('error')}")
        if challenge["op"] != "challenge" or not isinstance(nonce, str):
            raise ServerRefused(f"{self.where} is not a sqla-queue server")
        self.send({"op": "auth", "mac": mac(secret, nonce), "client": client_name})
        ready = self.receive(first_byte_timeout=self.timeout)
        if ready["op"] == "error" and ready.get("retry") is True:  # full: try again later
            raise ServerUnavailable(f"the queue server at {self.where}: {ready.get('error')}")
        if ready["op"] != "ready":
            raise ServerRefused(
                f"the queue server at {self.where} refused this client: {ready.get('error')} "
                "(check SQLA_QUEUE_SERVER_SECRET)"
            )
        self.queue = ready.get("queue")

    def send(self, message: dict[str, Any]) -> None:
        frame = encode(message)
        try:
            with self._send_lock:
                self._sock.settimeout(self.timeout)
                self._sock.sendall(frame)
        except OSError as exc:
            raise ServerUnavailable(
                f"lost the queue server at {self.where}: {describe_error(exc)}"
            ) from None

    def receive(self, *, first_byte_timeout: float | None) -> dict[str, Any]:
        """The next message. Waits ``first_byte_timeout`` (None: for ever)
        for it to start, raising TimeoutError; then it must arrive whole
        within the message timeout."""
        first = self._recv_exact(1, first_byte_timeout)
        try:
            header = first + self._recv_exact(HEADER.size - 1, self.timeout)
            return decode_body(self._recv_exact(body_length(header), self.timeout))
        except TimeoutError:
            raise ServerUnavailable(f"the queue server at {self.where} stalled") from None

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send a request and return its reply (a connection carries one
        request at a time; pushed wakes met meanwhile are dropped)."""
        request_id = next(self._ids)
        self.send({"op": op, "id": request_id, **fields})
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                message = self.receive(first_byte_timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise ServerUnavailable(
                    f"the queue server at {self.where} did not answer {op}"
                ) from None
            if message.get("id") != request_id:
                continue
            if message["op"] == "error":
                raise ServerRefused(f"the queue server at {self.where}: {message.get('error')}")
            return message

    def _recv_exact(self, count: int, timeout: float | None) -> bytes:
        data = bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(data) < count:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                self._sock.settimeout(remaining)
                chunk = self._sock.recv(count - len(data))
            except TimeoutError:
                raise
            except OSError as exc:
                raise ServerUnavailable(
                    f"lost the queue server at {self.where}: {describe_error(exc)}"
                ) from None
            if not chunk:
                raise ServerUnavailable(f"the queue server at {self.where} closed the connection")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
        with contextlib.suppress(OSError):
            self._sock.close()


def _client_ssl_context(settings: ServerSettings) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=settings.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot load SQLA_QUEUE_SERVER_TLS_CA {settings.tls_ca}: {describe_error(exc)}"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class ServerWakeups(Listener):
    """The worker's wake-up provider in client-server mode.

    ``listening`` is set while subscribed: the runner waits the long NOTIFY
    fallback then, and polls the database at its polling interval without."""

    def __init__(self, settings: ServerSettings, channel: str, *, client_name: str) -> None:
        self.settings = settings
        self.channel = channel
        self.client_name = client_name
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._conn: ServerConnection | None = None
        self._thread: threading.Thread | None = None

    def start(self, wake: Wake) -> None:
        """Connect once before returning: a refused client (wrong secret,
        another queue) stops the worker here; an absent server does not."""
        try:
            self._connect()
        except ServerUnavailable as exc:
            logger.warning("%s; polling the database until it answers", exc)
        self._thread = threading.Thread(
            target=self._run, args=(wake,), name="sqla-queue-server-wakeups", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            conn.close()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.message_timeout_seconds + 5)

    def notify(self) -> None:
        """Ask the server to wake the queue's workers (best effort)."""
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(SqlaQueueError):
                conn.send({"op": "notify", "id": 0, "queue": self.channel})

    def _connect(self) -> None:
        conn = ServerConnection.open(
            self.settings, self.settings.notify_port, client_name=self.client_name
        )
        try:
            conn.request("subscribe", queue=self.channel)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.listening.set()

    def _run(self, wake: Wake) -> None:
        delay = RECONNECT_MIN_SECONDS
        while not self._stop.is_set():
            if self._conn is None:
                try:
                    self._connect()
                except SqlaQueueError as exc:
                    if isinstance(exc, ServerRefused):
                        logger.error("%s", exc)
                    self._stop.wait(delay)
                    delay = min(delay * 2, RECONNECT_MAX_SECONDS)
                    continue
                logger.info("queue server at %s is back: waiting for its wake-ups", self.where)
            delay = RECONNECT_MIN_SECONDS
            wake.set()  # tasks may have arrived while nobody was listening
            conn = self._conn
            assert conn is not None
            try:
                self._listen(conn, wake)
            except SqlaQueueError as exc:
                if not self._stop.is_set():
                    logger.warning("%s; polling the database until it is back", exc)
            finally:
                self.listening.clear()
                conn.close()
                self._conn = None

    @property
    def where(self) -> str:
        return f"{self.settings.host}:{self.settings.notify_port}"

    def _listen(self, conn: ServerConnection, wake: Wake) -> None:
        """Set ``wake`` on every wake; ping a silent server, and give it up
        when a ping goes unanswered (a server host that vanished)."""
        ping_every = self.settings.keepalive_seconds / 3
        pinged = False
        while not self._stop.is_set():
            try:
                message = conn.receive(first_byte_timeout=ping_every)
            except TimeoutError:
                if pinged:
                    raise ServerUnavailable(
                        f"the queue server at {conn.where} stopped answering"
                    ) from None
                conn.send({"op": "ping", "id": 0})
                pinged = True
                continue
            pinged = False
            if message["op"] == "wake":
                wake.set()
            elif message["op"] == "error":
                raise ServerUnavailable(f"the queue server at {conn.where}: {message.get('error')}")


class ServerRoutineLock:
    """Maintenance routines' locks on the server's lock port.

    Satisfies the ``RoutineLock`` protocol (``sqla_queue.maintenance.lock``)
    structurally. One connection, opened on first use and shared by the
    process's routines; a lock lives as long as that connection, so a
    process that dies frees its routines' locks at once.

    No error of the server's escapes: one that cannot be reached, refuses
    this client (a rotated secret) or breaks the protocol grants nothing,
    the routine skips its turn and the next turn tries again on a fresh
    connection. It is logged once per outage (one line, then DEBUG until a
    lock is granted again)."""

    def __init__(self, settings: ServerSettings, *, client_name: str = "routines") -> None:
        self.settings = settings
        self.client_name = client_name
        self._conn: ServerConnection | None = None
        self._mutex = threading.Lock()
        self._failing = False

    def try_acquire(self, name: str) -> bool:
        lock_name(name)  # a bad name is the caller's mistake, not the server's
        with self._mutex:
            # a kept connection may have died with a server restart since its
            # last use: then one fresh connection is tried at once
            for fresh in (self._conn is None, True):
                try:
                    if self._conn is None:
                        self._conn = ServerConnection.open(
                            self.settings, self.settings.lock_port, client_name=self.client_name
                        )
                    granted = bool(self._conn.request("lock", name=name).get("granted"))
                except ServerUnavailable as exc:
                    self._drop()
                    if fresh:
                        self._failed(name, exc)
                        return False
                except Exception as exc:  # refused, or not a queue server: not this turn
                    self._drop()
                    self._failed(name, exc)
                    return False
                else:
                    if self._failing:
                        logger.info(
                            "routine locks: the queue server at %s grants again", self.where
                        )
                    self._failing = False
                    return granted
            return False  # not reached: the second pass returns

    def release(self, name: str) -> None:
        with self._mutex:
            if self._conn is None:
                return  # the connection went, and the lock with it
            try:
                self._conn.request("unlock", name=lock_name(name))
            except Exception as exc:  # the lock goes with the connection
                logger.debug("routine lock %s release: %s", name, describe_error(exc))
                self._drop()

    def close(self) -> None:
        with self._mutex:
            self._drop()

    @property
    def where(self) -> str:
        return f"{self.settings.host}:{self.settings.lock_port}"

    def _failed(self, name: str, exc: Exception) -> None:
        # once per outage, not once per routine and slot
        log = logger.debug if self._failing else logger.warning
        log("routine lock %s not taken: %s", name, describe_error(exc))
        self._failing = True

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def notify_queue(settings: ServerSettings, channel: str) -> int:
    """Wake ``channel``'s workers through the server now; how many were woken."""
    conn = ServerConnection.open(settings, settings.lock_port, client_name="notify")
    try:
        return int(conn.request("notify", queue=channel).get("woken", 0))
    finally:
        conn.close()
