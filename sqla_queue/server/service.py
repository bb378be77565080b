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
with an ``error`` frame and the connection is closed. A client that does
not read what it is sent is dropped once its unread output passes
:data:`MAX_UNREAD_BYTES`. Every error in a connection's handler ends that
connection, never the server.

Until it authenticates, a connection is a *stranger* (``admission.py``):
counted from its accept, before any TLS handshake, against caps of its own
(``SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED``, in all and per address), given
``SQLA_QUEUE_SERVER_AUTH_TIMEOUT`` seconds in all, and logged, when refused,
in one line per interval however many there are. So strangers never take
the places of workers: ``MAX_CLIENT_THREADS`` bounds the authenticated
connections alone, and a flood of strangers neither keeps a worker out nor
exhausts the file descriptors. To count a connection before its TLS
handshake the server accepts connections itself and starts TLS on each
(``loop.connect_accepted_socket``); ``asyncio.start_server`` would run the
handshake before it told anyone the connection existed.

The server holds nothing that a worker needs to get back after a restart:
claims are exclusive in the database, and in client-server mode the rescue
judges a task lost by its lease alone (docs/client-server.md). A restart
frees every lock, which only lets a maintenance routine run once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import secrets
import socket
import ssl
from collections.abc import Callable
from typing import Any

from ..common.redaction import describe_error
from ..common.server_protocol import (
    HEADER,
    ProtocolError,
    body_length,
    decode_body,
    encode,
    lock_name,
    mac,
)
from ..config.settings import ServerSettings
from .admission import REFUSAL_LOG_INTERVAL_SECONDS, Admission, RefusalLog, address_key

__all__ = ["LockTable", "QueueServer"]

logger = logging.getLogger("sqla_queue.server")

#: a subscriber that leaves this much unread is not reading: drop it
MAX_UNREAD_BYTES = 64 * 1024
#: locks one connection may hold (memory is bounded per client)
MAX_LOCKS_PER_CLIENT = 10_000
#: when the process is out of file descriptors (or memory), accepting
#: stops this long: the connections waiting meanwhile stay in the backlog
ACCEPT_PAUSE_SECONDS = 0.5
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_NOT_AUTHENTICATED, _AUTHENTICATION_FAILED = "authenticate first", "authentication failed"
#: counted apart in the refusal log; the other protocol errors together
_AUTHENTICATION_ERRORS = frozenset({_NOT_AUTHENTICATED, _AUTHENTICATION_FAILED})
NOTIFY, LOCK = "notify", "lock"
_OPS = {
    NOTIFY: frozenset({"lock", "unlock", "subscribe", "notify", "ping"}),
    LOCK: frozenset({"lock", "unlock", "notify", "ping"}),
}


class _Client:
    """One connection: its streams, its port, its locks."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: str, peer: str
    ):
        self.reader = reader
        self.writer = writer
        self.port = port
        self.peer = peer
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


class _Stranger:
    """A connection from its accept until it has authenticated: the task
    that serves it, which a drop (a cap, the deadline) cancels."""

    def __init__(self, sock: socket.socket, peer: str, address: str) -> None:
        self.sock = sock
        self.peer = peer
        self.address = address
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        #: why it was dropped (None: it was not)
        self.dropped: str | None = None
        #: whether the socket is a transport's now (it closes it)
        self.handed_over = False
        self.client: _Client | None = None

    def close_unless_handed_over(self, _: object = None) -> None:
        if not self.handed_over:
            self.sock.close()


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
        #: the authenticated connections (MAX_CLIENT_THREADS bounds them)
        self.clients: set[_Client] = set()
        self.strangers: Admission[_Stranger] = Admission(
            settings.max_unauthenticated, settings.max_unauthenticated_per_address
        )
        self.refusals = RefusalLog(logger)
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
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
            listeners = await _listen(
                self.host,
                self._ports[port_name],
                # long: a flood must not fill the accept queue, where a
                # worker's connection would wait for its SYN to be sent again
                backlog=max(socket.SOMAXCONN, self.settings.max_clients),
            )
            self._listeners += listeners
            self._ports[port_name] = listeners[0].getsockname()[1]
            for listener in listeners:
                self._spawn(self._accept(listener, port_name))
        return dict(self._ports)

    async def run(self) -> None:
        """Serve until :meth:`stop`."""
        background = [
            asyncio.create_task(self._check_tasks()),
            asyncio.create_task(self._flush_refusals()),
        ]
        try:
            await self._stopping.wait()
        finally:
            for listener in self._listeners:
                listener.close()
            for client in list(self.clients):
                client.writer.transport.abort()
            tasks = [*background, *self._tasks]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), self.timeout)
            self.refusals.flush(force=True)

    def stop(self) -> None:
        self._stopping.set()

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _flush_refusals(self) -> None:
        """The refusal log's summary line, also when the refusals stop."""
        while True:
            await asyncio.sleep(REFUSAL_LOG_INTERVAL_SECONDS / 2)
            self.refusals.flush()

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

    # ------------------------------------------------------------ strangers
    async def _accept(self, listener: socket.socket, port: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self.refusals.note(self.host, f"cannot accept: {describe_error(exc)}")
                    await asyncio.sleep(ACCEPT_PAUSE_SECONDS)
                continue  # else the peer left before it was accepted
            self._admit(sock, address, port)
            await asyncio.sleep(0)  # sock_accept does not yield while connections wait

    def _admit(self, sock: socket.socket, address: Any, port: str) -> None:
        """Count a new connection in, as a stranger, and start serving it;
        drop whom the caps say."""
        host = str(address[0]) if isinstance(address, tuple) else str(address)
        if isinstance(address, tuple):
            peer = f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
        else:
            peer = host
        stranger = _Stranger(sock, peer, address_key(host))
        _keepalive(sock, self.settings.keepalive_seconds)
        stranger.task = self._spawn(self._serve(stranger, port))
        stranger.task.add_done_callback(stranger.close_unless_handed_over)
        timeout = self.settings.auth_timeout_seconds
        stranger.deadline = asyncio.get_running_loop().call_later(
            timeout,
            self._drop,
            stranger,
            f"did not authenticate within {timeout:g} s (SQLA_QUEUE_SERVER_AUTH_TIMEOUT)",
        )
        for victim, reason in self.strangers.admit(stranger.address, stranger):
            self._drop(victim, reason)

    def _drop(self, stranger: _Stranger, reason: str) -> None:
        self.strangers.leave(stranger.address, stranger)
        if stranger.deadline is not None:
            stranger.deadline.cancel()
        if stranger.dropped is None and stranger.task is not None:
            stranger.dropped = reason
            stranger.task.cancel()
            self.refusals.note(stranger.peer, reason)

    def _welcomed(self, stranger: _Stranger) -> None:
        """No longer a stranger: authenticated, or gone."""
        self.strangers.leave(stranger.address, stranger)
        if stranger.deadline is not None:
            stranger.deadline.cancel()

    async def _welcome(self, stranger: _Stranger, port: str) -> _Client | None:
        """The TLS handshake and the challenge: the authenticated client, or
        None (then the connection is closed, and the refusal noted)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        stranger.handed_over = True
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol,
                stranger.sock,
                ssl=self._ssl,
                # our own deadline comes first; this one only bounds asyncio's
                ssl_handshake_timeout=2 * self.settings.auth_timeout_seconds if self._ssl else None,
            )
        except ssl.SSLError as exc:
            self.refusals.note(stranger.peer, f"TLS handshake failed ({exc.reason or 'SSL'})")
            return None
        except OSError as exc:
            logger.debug("%s went away in its TLS handshake: %s", stranger.peer, exc)
            return None
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        client = stranger.client = _Client(reader, writer, port, stranger.peer)
        try:
            if len(self.clients) >= self.settings.max_clients:
                raise _Full
            await self._authenticate(client)
        except _Full:
            self.refusals.note(client.peer, "the server is full (MAX_CLIENT_THREADS)")
            client.push(_FULL)
        except ProtocolError as exc:
            kind = str(exc) if str(exc) in _AUTHENTICATION_ERRORS else "broke the protocol"
            self.refusals.note(client.peer, str(exc), kind=kind)
            with contextlib.suppress(Exception):
                client.push({"op": "error", "error": str(exc)})
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
            logger.debug("%s went away before it authenticated: %s", client.peer, exc)
        else:
            self._welcomed(stranger)
            if len(self.clients) < self.settings.max_clients:
                self.clients.add(client)
                return client
            # others authenticated meanwhile, and took the last places
            self.refusals.note(client.peer, "the server is full (MAX_CLIENT_THREADS)")
            client.push(_FULL)
        # at once: a graceful close (a TLS shutdown above all) would hold the
        # socket, uncounted, for as long as the stranger let it
        transport.abort()
        return None

    async def _serve(self, stranger: _Stranger, port: str) -> None:
        try:
            client = await self._welcome(stranger, port)
        except asyncio.CancelledError:
            if stranger.dropped is None:
                raise  # the server is stopping
            if stranger.client is not None:
                with contextlib.suppress(Exception):
                    stranger.client.push({"op": "error", "error": stranger.dropped})
                stranger.client.writer.transport.abort()
            return
        finally:
            self._welcomed(stranger)
        if client is not None:
            await self._converse(client)

    # ------------------------------------------------------------ clients
    async def _converse(self, client: _Client) -> None:
        """Serve an authenticated client until it goes or breaks the protocol."""
        try:
            await self._send(client, {"op": "ready", "queue": self.channel, "port": client.port})
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
            await _close(client.writer, self.timeout)

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
        """The challenge and its answer, within the stranger's deadline (no
        timeout of its own: the deadline cancels this)."""
        nonce = secrets.token_hex(32)
        client.writer.write(encode({"op": "challenge", "nonce": nonce, "version": 1}))
        await client.writer.drain()
        message = await self._read_rest(client, b"")
        answer = message.get("mac")
        if message["op"] != "auth" or not isinstance(answer, str):
            raise ProtocolError(_NOT_AUTHENTICATED)
        expected = mac(self._secret, nonce)
        # compare_digest takes ASCII text only: anything else is a wrong answer
        if not (answer.isascii() and hmac.compare_digest(answer, expected)):
            raise ProtocolError(_AUTHENTICATION_FAILED)
        name = message.get("client")
        client.name = name[:100] if isinstance(name, str) and name.isprintable() else "?"

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
    from ..common.exceptions import ConfigurationError

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


class _Full(Exception):
    """The server serves MAX_CLIENT_THREADS authenticated clients already."""


#: a full server: the client is to try again later (a ServerUnavailable to it)
_FULL = {"op": "error", "error": "the server is full (MAX_CLIENT_THREADS)", "retry": True}


async def _listen(host: str, port: int, *, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (as
    ``loop.create_server`` binds them), on one port: port 0 picks a free one."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(listeners) > 1:  # the port the first one got
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _keepalive(sock: socket.socket, seconds: float) -> None:
    """Probe a silent peer after ``seconds``, three times, a third apart:
    a peer that vanished without closing (a powered-off host, a network
    cut) is found and its locks freed, within twice ``seconds``; and
    ``TCP_USER_TIMEOUT`` gives up on a peer that leaves what was sent to it
    unacknowledged as long (keepalive probes wait while data is in flight)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(seconds)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(seconds / 3)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            timeout_ms = max(1000, int(2 * seconds * 1000))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, timeout_ms)


async def _close(writer: asyncio.StreamWriter, timeout: float) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), timeout)
