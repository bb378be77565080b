"""A real ``sqla-queue server`` process for the tests, on free ports.

:class:`ServerProcess` starts the CLI in a subprocess, waits until it
answers an authenticated ping on both ports, and can be killed (SIGKILL),
stopped (SIGTERM) and started again on the same ports. ``env()`` gives the
variables a worker needs to use it (client-server mode). Its output is read
by a thread so a full pipe never stalls it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqla_queue.common.server_protocol import HEADER, body_length, decode_body, encode, mac
from sqla_queue.config.settings import ServerSettings
from sqla_queue.server import ServerConnection, ServerUnavailable
from tests.conftest import spawn_cli, wait_until

SECRET = "test-secret-0123456789-abcdef"
#: short, so that slow and silent clients are dropped quickly in tests
MESSAGE_TIMEOUT = "1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(
        self, worker: str, url: str, table: str, *, tls_ca: str | None = None, **env: str
    ) -> None:
        self.worker = worker
        self.tls_ca = tls_ca  # clients verify the server's certificate with it
        self.url = url
        self.notify_port = free_port()
        self.lock_port = free_port()
        #: the server's secret (the next start's, when changed); the clients' too
        self.secret = SECRET
        self.server_env = {
            "SQLA_QUEUE_TEST_TABLE": table,
            "TIMEOUT_SOCKET_MESSAGE": MESSAGE_TIMEOUT,
            "CHECK_TASKS_INTERVAL": "0.2",
            **env,
        }
        self.proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []

    @property
    def settings(self) -> ServerSettings:
        return ServerSettings(
            enabled=True,
            notify_port=self.notify_port,
            lock_port=self.lock_port,
            secret=self.secret,
            message_timeout_seconds=float(MESSAGE_TIMEOUT),
            tls=self.tls_ca is not None,
            tls_ca=self.tls_ca,
        )

    def env(self, **extra: str) -> dict[str, str]:
        """A worker's environment for client-server mode on this server."""
        return {
            "CLIENT_SERVER_MODE": "true",
            "SERVER_HOST": "127.0.0.1",
            "NOTIFY_SERVICE_PORT": str(self.notify_port),
            "LOCK_SERVICE_PORT": str(self.lock_port),
            "SQLA_QUEUE_SERVER_SECRET": self.secret,
            **extra,
        }

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def start(self) -> None:
        self._lines = []
        self.proc = spawn_cli(
            "server",
            self.worker,
            "--url",
            self.url,
            "--notify-port",
            str(self.notify_port),
            "--lock-port",
            str(self.lock_port),
            env={**self.server_env, "SQLA_QUEUE_SERVER_SECRET": self.secret},
        )
        proc = self.proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        wait_until(self.answers, timeout=30, interval=0.05, message=f"the server\n{self.output}")

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.append(line)

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited {self.proc.returncode}:\n{self.output}")
        try:
            for port in (self.notify_port, self.lock_port):
                conn = ServerConnection.open(self.settings, port, client_name="probe")
                try:
                    conn.request("ping")
                finally:
                    conn.close()
        except ServerUnavailable:
            return False
        return True

    def open_files(self) -> int:
        """How many file descriptors the server process holds now."""
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def connect(self, port: int | None = None, name: str = "test") -> ServerConnection:
        return ServerConnection.open(self.settings, port or self.lock_port, client_name=name)


@contextmanager
def running_server(worker: str, url: str, table: str, **env: str) -> Iterator[ServerProcess]:
    server = ServerProcess(worker, url, table, **env)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def raw_socket(port: int) -> socket.socket:
    """A plain TCP connection, for clients that misbehave on purpose."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def read_until_closed(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the server sends until it closes the connection (within ``timeout``)."""
    data = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk
    raise AssertionError(f"the server did not close the connection within {timeout} s")


# --------------------------------------------------------------------- raw clients
def receive(sock: socket.socket) -> dict[str, Any]:
    header = _exact(sock, HEADER.size)
    return decode_body(_exact(sock, body_length(header)))


def _exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def authenticated(port: int) -> socket.socket:
    """A raw socket past the handshake."""
    sock = raw_socket(port)
    challenge = receive(sock)
    sock.sendall(encode({"op": "auth", "mac": mac(SECRET.encode(), challenge["nonce"])}))
    assert receive(sock)["op"] == "ready"
    return sock


def error_then_close(sock: socket.socket) -> str:
    """The error the server sends before it closes the connection."""
    data = read_until_closed(sock)
    length = body_length(data[: HEADER.size])
    return str(decode_body(data[HEADER.size : HEADER.size + length])["error"])


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
