"""The queue server: locks and wake-ups for workers, over sockets.

One process, one asyncio event loop, no thread per client (the database
look-up alone runs in a worker thread, so a slow database never stalls the
sockets). It listens on two ports, as the seed's server did:

- the *notify* port, where each worker keeps one connection open and
  ``subscribe``-s to its queue; the server pushes ``wake`` to every
  subscriber when the queue has ready tasks (it looks every
  ``CHECK_TASKS_INTERVAL`` seconds) or when a client sends ``notify``;
- the *lock* port, for maintenance routines' named locks.

Both ports grant locks (``lock`` / ``unlock``), and every lock belongs to
the connection that took it: only that connection releases it, and it is
released when that connection closes, whichever port it came through (the
reference freed lock-port locks never, and let anyone release anyone's).

What a client sends can cost that client its connection and nothing else:
a frame that is not the protocol's, too big, or that does not arrive whole
within ``TIMEOUT_SOCKET_MESSAGE`` (a slow or partial sender) is answered
with an ``error`` frame and the connection is closed; an unauthenticated
client gets ``TIMEOUT_SOCKET_MESSAGE`` to authenticate, and a wrong answer
closes it. A client that does not read what it is sent is dropped once its
unread output passes :data:`MAX_UNREAD_BYTES`. At most ``MAX_CLIENT_THREADS``
clients are served at once; the next one is told so and closed. Every error
in a connection's handler ends that connection, never the server.

The server holds nothing that a worker needs to get back after a restart:
claims are exclusive in the database, and in client-server mode the rescue
judges a task lost by its lease alone (docs/client-server.md). A restart
frees every lock, which only lets a maintenance routine run once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import secrets
import socket
import ssl
from collections.abc import Callable
from typing import Any

from ..redaction import describe_error
from ..settings import ServerSettings
from .protocol import (
    HEADER,
    ProtocolError,
    body_length,
    decode_body,
    encode,
    lock_name,
    mac,
)

__all__ = ["LockTable", "QueueServer"]

logger = logging.getLogger("sqla_queue.server")

#: a subscriber that leaves this much unread is not reading: drop it
MAX_UNREAD_BYTES = 64 * 1024
#: locks one connection may hold (memory is bounded per client)
MAX_LOCKS_PER_CLIENT = 10_000
NOTIFY, LOCK = "notify", "lock"
_OPS = {
    NOTIFY: frozenset({"lock", "unlock", "subscribe", "notify", "ping"}),
    LOCK: frozenset({"lock", "unlock", "notify", "ping"}),
}


class _Client:
    """One connection: its streams, its port, its locks."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: str):
        self.reader = reader
        self.writer = writer
        self.port = port
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.name = "?"
        self.locks: set[str] = set()
        self.subscribed = False

    def __repr__(self) -> str:
        return f"{self.name}@{self.peer} ({self.port} port)"

    def push(self, message: dict[str, Any]) -> bool:
        """Queue ``message`` without waiting; False when the client is not
        reading (then it is closed)."""
        transport = self.writer.transport
        if transport.is_closing():
            return False
        if transport.get_write_buffer_size() > MAX_UNREAD_BYTES:
            logger.warning("client %r does not read what it is sent: closing it", self)
            transport.abort()
            return False
        self.writer.write(encode(message))
        return True


class LockTable:
    """Named locks, each held by one client at most."""

    def __init__(self) -> None:
        self._holders: dict[str, _Client] = {}

    def try_acquire(self, name: str, client: _Client) -> bool:
        holder = self._holders.get(name)
        if holder is client:
            return True  # not counted: one unlock releases it
        if holder is not None:
            return False
        if len(client.locks) >= MAX_LOCKS_PER_CLIENT:
            raise ProtocolError(f"a client may hold at most {MAX_LOCKS_PER_CLIENT} locks")
        self._holders[name] = client
        client.locks.add(name)
        return True

    def release(self, name: str, client: _Client) -> bool:
        if self._holders.get(name) is not client:
            return False
        del self._holders[name]
        client.locks.discard(name)
        return True

    def release_all(self, client: _Client) -> int:
        for name in client.locks:
            if self._holders.get(name) is client:
                del self._holders[name]
        count = len(client.locks)
        client.locks.clear()
        return count

    def holder(self, name: str) -> str | None:
        client = self._holders.get(name)
        return None if client is None else repr(client)


class QueueServer:
    """Serves one queue (``channel``); ``ready_check`` (run in a thread)
    says whether the queue has a ready task. Ports of 0 pick free ones."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        channel: str,
        ready_check: Callable[[], bool] | None = None,
        host: str = "127.0.0.1",
        notify_port: int | None = None,
        lock_port: int | None = None,
    ) -> None:
        self.settings = settings
        self.channel = channel
        self.ready_check = ready_check
        self.host = host
        self._secret = settings.secret_bytes()
        self._ports = {
            NOTIFY: settings.notify_port if notify_port is None else notify_port,
            LOCK: settings.lock_port if lock_port is None else lock_port,
        }
        self.locks = LockTable()
        self.clients: set[_Client] = set()
        self._servers: list[asyncio.Server] = []
        self._stopping = asyncio.Event()
        self._ssl = _server_ssl_context(settings)

    @property
    def ports(self) -> dict[str, int]:
        """The notify and lock ports (the bound ones once started)."""
        return dict(self._ports)

    @property
    def timeout(self) -> float:
        return self.settings.message_timeout_seconds

    # ------------------------------------------------------------ life
    async def start(self) -> dict[str, int]:
        """Bind both ports; the ports bound."""
        for port_name in (NOTIFY, LOCK):
            server = await asyncio.start_server(
                functools.partial(self._serve, port=port_name),
                host=self.host,
                port=self._ports[port_name],
                ssl=self._ssl,
                ssl_handshake_timeout=self.timeout if self._ssl else None,
                reuse_address=True,
                backlog=self.settings.max_clients,
            )
            self._servers.append(server)
            self._ports[port_name] = server.sockets[0].getsockname()[1]
        return dict(self._ports)

    async def run(self) -> None:
        """Serve until :meth:`stop`."""
        checker = asyncio.create_task(self._check_tasks())
        try:
            await self._stopping.wait()
        finally:
            checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checker
            for server in self._servers:
                server.close()
            for client in list(self.clients):
                client.writer.transport.abort()
            for server in self._servers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), self.timeout)

    def stop(self) -> None:
        self._stopping.set()

    # ------------------------------------------------------------ wake-ups
    async def _check_tasks(self) -> None:
        """Every CHECK_TASKS_INTERVAL, wake the subscribers if the queue
        has a ready (or due scheduled) task."""
        interval = self.settings.check_tasks_interval_seconds
        check = self.ready_check
        if check is None:
            return
        while True:
            if any(client.subscribed for client in self.clients):
                try:
                    ready = await asyncio.to_thread(check)
                except Exception as exc:  # the database is away: look again later
                    logger.warning("cannot look at the queue: %s", describe_error(exc))
                    ready = False
                if ready:
                    self.wake()
            await asyncio.sleep(interval)

    def wake(self) -> int:
        """Push ``wake`` to every subscriber; how many were sent one."""
        message = {"op": "wake", "queue": self.channel}
        return sum(1 for c in list(self.clients) if c.subscribed and c.push(message))

    # ------------------------------------------------------------ clients
    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: str
    ) -> None:
        client = _Client(reader, writer, port)
        if len(self.clients) >= self.settings.max_clients:
            logger.warning("refusing %s: %d clients already", client.peer, len(self.clients))
            with contextlib.suppress(Exception):
                client.push({"op": "error", "error": "the server is full (MAX_CLIENT_THREADS)"})
            await _close(writer, self.timeout)
            return
        self.clients.add(client)
        _keepalive(writer, self.settings.keepalive_seconds)
        try:
            await self._authenticate(client)
            while True:
                message = await self._read(client, idle=True)
                await self._send(client, self._answer(client, message))
        except ProtocolError as exc:
            logger.warning("client %r broke the protocol: %s; closing it", client, exc)
            with contextlib.suppress(Exception):
                client.push({"op": "error", "error": str(exc)})
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
            logger.debug("client %r went away: %s", client, describe_error(exc))
        except Exception as exc:  # never the server's death: this client's only
            logger.error("client %r: unexpected %s; closing it", client, describe_error(exc))
        finally:
            self.clients.discard(client)
            released = self.locks.release_all(client)
            if released:
                logger.info("client %r closed: %d lock(s) released", client, released)
            await _close(writer, self.timeout)

    async def _read(self, client: _Client, *, idle: bool) -> dict[str, Any]:
        """The next message. An idle client may wait for ever before the
        first byte of a frame (TCP keepalive finds a vanished peer); the
        whole frame must then arrive within the message timeout."""
        first = await client.reader.readexactly(1) if idle else b""
        try:
            return await asyncio.wait_for(self._read_rest(client, first), self.timeout)
        except asyncio.TimeoutError:
            what = "its frame" if first else "anything"
            raise ProtocolError(f"sent {what} too slowly (TIMEOUT_SOCKET_MESSAGE)") from None

    @staticmethod
    async def _read_rest(client: _Client, first: bytes) -> dict[str, Any]:
        header = first + await client.reader.readexactly(HEADER.size - len(first))
        length = body_length(header)
        return decode_body(await client.reader.readexactly(length))

    async def _send(self, client: _Client, message: dict[str, Any]) -> None:
        client.writer.write(encode(message))
        try:
            await asyncio.wait_for(client.writer.drain(), self.timeout)
        except asyncio.TimeoutError:
            raise ProtocolError("does not read its replies") from None

    async def _authenticate(self, client: _Client) -> None:
        nonce = secrets.token_hex(32)
        await self._send(client, {"op": "challenge", "nonce": nonce, "version": 1})
        message = await self._read(client, idle=False)
        answer = message.get("mac")
        if message["op"] != "auth" or not isinstance(answer, str):
            raise ProtocolError("authenticate first")
        if not hmac.compare_digest(answer.encode(), mac(self._secret, nonce).encode()):
            raise ProtocolError("authentication failed")
        name = message.get("client")
        client.name = name[:100] if isinstance(name, str) and name.isprintable() else "?"
        await self._send(client, {"op": "ready", "queue": self.channel, "port": client.port})

    def _answer(self, client: _Client, message: dict[str, Any]) -> dict[str, Any]:
        op = message["op"]
        request_id = message.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            raise ProtocolError("a request needs an integer id")
        if op not in _OPS[client.port]:
            raise ProtocolError(f"unknown op {op[:40]!r} on the {client.port} port")
        reply: dict[str, Any] = {"op": "reply", "id": request_id}
        if op == "lock":
            reply["granted"] = self.locks.try_acquire(lock_name(message.get("name")), client)
        elif op == "unlock":
            reply["released"] = self.locks.release(lock_name(message.get("name")), client)
        elif op in ("subscribe", "notify"):
            queue = message.get("queue")
            if queue != self.channel:
                shown = queue[:80] if isinstance(queue, str) else queue
                return {
                    "op": "error",
                    "id": request_id,
                    "error": f"this server serves queue {self.channel!r}, not {shown!r}",
                }
            if op == "subscribe":
                client.subscribed = True
            else:
                reply["woken"] = self.wake()
        return reply


def _server_ssl_context(settings: ServerSettings) -> ssl.SSLContext | None:
    from ..exceptions import ConfigurationError

    if settings.tls_cert is None and settings.tls_key is None:
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise ConfigurationError(
            "TLS needs both SQLA_QUEUE_SERVER_TLS_CERT and SQLA_QUEUE_SERVER_TLS_KEY"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot load the TLS certificate {settings.tls_cert}: {describe_error(exc)}"
        ) from None
    return context


def _keepalive(writer: asyncio.StreamWriter, seconds: float) -> None:
    """Probe a silent peer after ``seconds``, three times, a third apart:
    a peer that vanished without closing (a powered-off host) is found and
    its locks freed."""
    sock: socket.socket | None = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(seconds)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(seconds / 3)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


async def _close(writer: asyncio.StreamWriter, timeout: float) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), timeout)
