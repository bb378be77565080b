"""The queue server against clients that misbehave, and against many.

Every test talks to a real ``sqla-queue server`` process (tests/support/queue_server.py)
over TCP. Misbehaving clients use raw sockets; well-behaved ones use the
library's own client. After each abuse the server must still serve others,
and must never have died (ServerProcess.answers() fails if it exited).
TIMEOUT_SOCKET_MESSAGE is 1 s for these servers, so slow clients are dropped
quickly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select

from sqla_queue import QueueClient
from sqla_queue.common.server_protocol import MAX_BODY_BYTES, encode, mac
from sqla_queue.config.settings import ServerSettings
from sqla_queue.config.timing import Every
from sqla_queue.maintenance import Maintenance, ManualClock, RoutineResult
from sqla_queue.server import (
    ServerConnection,
    ServerRefused,
    ServerRoutineLock,
    ServerUnavailable,
)
from tests.conftest import run_cli, server_url, spawn_cli, wait_until
from tests.support.app import App, build
from tests.support.queue_server import (
    SECRET,
    ServerProcess,
    authenticated,
    error_then_close,
    make_certificate,
    raw_socket,
    read_until_closed,
    receive,
    running_server,
)

RECORDING = "tests.support.app:RecordingWorker"


# --------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def mariadb() -> Iterator[tuple[Engine, App, str]]:
    """A queue table on the shared MariaDB for this module's servers."""
    url = str(server_url("mysql"))
    table = f"fila_srv_{int(time.time() * 1000) % 10**9}"
    app = build(table)
    engine = create_engine(url)
    app.Base.metadata.create_all(engine)
    try:
        yield engine, app, url
    finally:
        app.Base.metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture(scope="module")
def server(mariadb: tuple[Engine, App, str]) -> Iterator[ServerProcess]:
    _, app, url = mariadb
    # fifty clients of one address authenticate at once in a test below
    with running_server(
        RECORDING,
        url,
        app.Task.__table__.name,
        MAX_CLIENT_THREADS="100",
        SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED_PER_ADDRESS="64",
    ) as s:
        yield s


@pytest.fixture(autouse=True)
def _server_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "server" in request.fixturenames:
        assert request.getfixturevalue("server").answers()


# --------------------------------------------------------------------- helpers
def lock(conn: ServerConnection, name: str) -> bool:
    return bool(conn.request("lock", name=name)["granted"])


def assert_served(server: ServerProcess) -> None:
    """Another client is served at once: take and give back a lock."""
    with _closing(server.connect(name="bystander")) as conn:
        assert lock(conn, "bystander")
        assert conn.request("unlock", name="bystander")["released"] is True


class _closing:
    def __init__(self, conn: ServerConnection) -> None:
        self.conn = conn

    def __enter__(self) -> ServerConnection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


# --------------------------------------------------------------------- garbage
GARBAGE = {
    "http": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad magic"),
    "reference-protocol": (b"try_lock(11)###END###", "bad magic"),
    "version-2": (struct.pack("!2sBI", b"SQ", 2, 2) + b"{}", "protocol version 2"),
    "invalid-utf8": (struct.pack("!2sBI", b"SQ", 1, 4) + b"\xff\xfe\xfd\xfc", "not JSON"),
    "not-an-object": (struct.pack("!2sBI", b"SQ", 1, 2) + b"[]", "not an object"),
    "deep-nesting": (
        struct.pack("!2sBI", b"SQ", 1, 10000) + b"[" * 10000,
        "not JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
@pytest.mark.parametrize("after_auth", [False, True], ids=["before-auth", "after-auth"])
def test_garbage_costs_the_sender_its_connection_and_nobody_else_anything(
    server: ServerProcess, case: str, after_auth: bool
) -> None:
    frame, expected = GARBAGE[case]
    with _closing(server.connect(name="holder")) as holder:
        assert lock(holder, "held")
        sock = authenticated(server.lock_port) if after_auth else raw_socket(server.lock_port)
        with sock:
            if not after_auth:
                assert receive(sock)["op"] == "challenge"
            sock.sendall(frame)
            assert expected in error_then_close(sock)
        # the bystander's lock survived, and the server serves others
        assert lock(holder, "held")
        assert_served(server)


def test_unknown_op_and_bad_lock_name_close_the_connection(server: ServerProcess) -> None:
    for message, expected in (
        ({"op": "halt_server", "id": 1}, "unknown op 'halt_server'"),
        ({"op": "subscribe", "id": 1, "queue": "x"}, "unknown op 'subscribe' on the lock port"),
        ({"op": "lock", "id": 1, "name": "a b"}, "a lock name is"),
        ({"op": "lock", "id": 1, "name": "x" * 201}, "a lock name is"),
        ({"op": "lock", "name": "no-id"}, "integer id"),
    ):
        with authenticated(server.lock_port) as sock:
            sock.sendall(encode(message))
            assert expected in error_then_close(sock)
    assert_served(server)


def test_oversized_frame_is_refused_from_its_header(server: ServerProcess) -> None:
    with authenticated(server.lock_port) as sock:
        sock.sendall(struct.pack("!2sBI", b"SQ", 1, 50 * 1024 * 1024))  # no body follows
        assert f"over the limit of {MAX_BODY_BYTES}" in error_then_close(sock)
    assert_served(server)


# --------------------------------------------------------------------- slow, partial, silent
def test_partial_frame_is_dropped_after_the_timeout_while_others_are_served(
    server: ServerProcess,
) -> None:
    with authenticated(server.lock_port) as sock:
        frame = encode({"op": "lock", "id": 1, "name": "partial"})
        sock.sendall(frame[:-3])  # never finished
        assert_served(server)  # meanwhile, at once
        assert "too slowly" in error_then_close(sock)
    with _closing(server.connect()) as conn:
        assert lock(conn, "partial")  # the partial request never took it


def test_slow_client_sending_a_byte_at_a_time_is_dropped(server: ServerProcess) -> None:
    frame = encode({"op": "lock", "id": 1, "name": "slow"})
    closed = threading.Event()
    with authenticated(server.lock_port) as sock:

        def dribble() -> None:
            for byte in frame:
                if closed.wait(0.25):  # a byte every quarter second: 6 s in all
                    return
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    return

        sender = threading.Thread(target=dribble)
        sender.start()
        try:
            assert_served(server)
            assert "too slowly" in error_then_close(sock)
        finally:
            closed.set()
            sender.join(timeout=10)
    assert_served(server)


def test_silent_unauthenticated_client_is_dropped(server: ServerProcess) -> None:
    with raw_socket(server.notify_port) as sock:
        assert receive(sock)["op"] == "challenge"
        assert "did not authenticate within 3 s" in error_then_close(sock)


def test_wrong_secret_is_refused_and_disconnected(server: ServerProcess) -> None:
    with raw_socket(server.lock_port) as sock:
        challenge = receive(sock)
        sock.sendall(encode({"op": "auth", "mac": mac(b"not the secret", challenge["nonce"])}))
        assert error_then_close(sock) == "authentication failed"
    wrong = dataclasses.replace(server.settings, secret="y" * 20)
    with pytest.raises(ServerRefused, match="check SQLA_QUEUE_SERVER_SECRET"):
        ServerConnection.open(wrong, server.lock_port, client_name="intruder")


def test_a_request_before_authentication_takes_no_lock(server: ServerProcess) -> None:
    with raw_socket(server.lock_port) as sock:
        receive(sock)
        sock.sendall(encode({"op": "lock", "id": 1, "name": "early"}))
        assert error_then_close(sock) == "authenticate first"
    with _closing(server.connect()) as conn:
        assert lock(conn, "early")


def test_a_replayed_answer_is_worth_nothing(server: ServerProcess) -> None:
    with raw_socket(server.lock_port) as first:
        answer = mac(SECRET.encode(), receive(first)["nonce"])
        first.sendall(encode({"op": "auth", "mac": answer}))
        assert receive(first)["op"] == "ready"
    with raw_socket(server.lock_port) as second:
        receive(second)  # a new nonce
        second.sendall(encode({"op": "auth", "mac": answer}))
        assert error_then_close(second) == "authentication failed"


# --------------------------------------------------------------------- locks
@pytest.mark.parametrize("port", ["notify", "lock"])
def test_locks_belong_to_their_connection_and_die_with_it(server: ServerProcess, port: str) -> None:
    number = server.notify_port if port == "notify" else server.lock_port
    name = f"routine-{port}"
    with _closing(server.connect(number, "a")) as a, _closing(server.connect(name="b")) as b:
        assert lock(a, name)
        assert lock(a, name)  # again: still a's, not counted
        assert not lock(b, name)
        assert b.request("unlock", name=name)["released"] is False  # not b's to release
        assert not lock(b, name)
        a.close()  # the holder goes away without unlocking
        wait_until(lambda: lock(b, name), timeout=10, message="the lock to be freed")


def test_server_routine_lock_satisfies_the_routine_lock_protocol(server: ServerProcess) -> None:
    first = ServerRoutineLock(server.settings, client_name="first")
    second = ServerRoutineLock(server.settings, client_name="second")
    try:
        assert first.try_acquire("purge")
        assert not second.try_acquire("purge")
        first.release("purge")
        assert second.try_acquire("purge")
        second.close()  # a process that dies frees its routines' locks
        assert first.try_acquire("purge")
    finally:
        first.close()
        second.close()


def test_routine_lock_takes_a_fresh_connection_after_a_server_restart(
    mariadb: tuple[Engine, App, str],
) -> None:
    _, app, url = mariadb
    with running_server(RECORDING, url, app.Task.__table__.name) as restarted:
        routine = ServerRoutineLock(restarted.settings, client_name="routines")
        try:
            assert routine.try_acquire("purge")
            restarted.kill()
            restarted.start()  # the kept connection is dead, and the lock with it
            assert routine.try_acquire("rescue")
            assert routine.try_acquire("purge")
        finally:
            routine.close()


def test_routine_lock_grants_nothing_when_the_server_is_away() -> None:
    from tests.support.queue_server import free_port

    away = ServerSettings(secret=SECRET, lock_port=free_port(), message_timeout_seconds=1)
    routine = ServerRoutineLock(away)
    assert routine.try_acquire("purge") is False
    routine.release("purge")  # nothing held: nothing to do, no error


class _CountingRoutine:
    """A routine that counts its rounds, every minute."""

    name = "counting"
    schedule = Every(60)

    def __init__(self) -> None:
        self.rounds = 0

    def run_once(self, *, dry_run: bool = False) -> RoutineResult:
        self.rounds += 1
        return RoutineResult(self.name)


class _GarbageServer:
    """Something on the lock port that is not a queue server: it answers
    every connection with an HTTP error and closes it."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", port))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.listener.close()
        self.thread.join(timeout=10)


@pytest.mark.parametrize("fault", ["rotated-secret", "not-a-queue-server"])
def test_a_routine_outlives_a_lock_server_that_refuses_it_and_runs_once_it_is_fixed(
    mariadb: tuple[Engine, App, str], fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, app, url = mariadb
    server = ServerProcess(RECORDING, url, app.Task.__table__.name)
    # the client waits long for each answer: on a loaded machine the servers'
    # replies could take past 1 s, and a timeout is another outage than the
    # refusal this test is about (its line would name the timeout)
    patient = dataclasses.replace(server.settings, message_timeout_seconds=30.0)
    routine_lock = ServerRoutineLock(patient, client_name="routines")
    routine = _CountingRoutine()
    clock = ManualClock(dt.datetime(2030, 1, 1, 0, 0, 30, tzinfo=dt.timezone.utc))
    maintenance = Maintenance([routine], routine_lock, clock=clock)  # type: ignore[list-item]
    garbage = None
    if fault == "rotated-secret":  # the server came back with another secret
        server.secret = "rotated-secret-0123456789"
        server.start()
    else:
        garbage = _GarbageServer(server.lock_port)
    maintenance.start()
    [thread] = maintenance._threads
    try:
        for _ in range(2):  # refused twice: the thread lives on, the routine waits
            slot = clock.advance(60).replace(second=0)
            wait_until(
                lambda slot=slot: maintenance.considered("counting") == slot,
                message=f"the routine thread to deal with slot {slot}",
            )
            assert thread.is_alive()
        assert routine.rounds == 0
        if garbage is not None:
            garbage.close()
        server.kill()
        server.secret = SECRET  # fixed
        server.start()
        slot = clock.advance(60).replace(second=0)
        wait_until(lambda: routine.rounds == 1, message="the routine to run once fixed")
        assert thread.is_alive()
    finally:
        maintenance.stop()
        server.kill()
        if garbage is not None:
            garbage.close()
    lines = [r for r in caplog.records if r.name.startswith("sqla_queue")]
    # one line for the outage (two refused slots), without a traceback or the secret
    refusals = [
        r.getMessage()
        for r in lines
        if r.levelno >= logging.WARNING and "routine lock counting" in r.getMessage()
    ]
    assert len(refusals) == 1, [r.getMessage() for r in lines]
    expected = "authentication failed" if fault == "rotated-secret" else "bad magic"
    assert expected in refusals[0]
    assert all(r.exc_info is None for r in lines)
    assert not any(SECRET in r.getMessage() or "rotated" in r.getMessage() for r in lines)


class _RaisingLock:
    """A routine lock that raises at its first take and its first release."""

    def __init__(self) -> None:
        self.calls = 0

    def try_acquire(self, name: str) -> bool:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the lock broke")
        return True

    def release(self, name: str) -> None:
        if self.calls == 2:
            raise RuntimeError("the release broke")


def test_a_routine_lock_that_raises_never_ends_the_routine_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routine = _CountingRoutine()
    clock = ManualClock(dt.datetime(2030, 1, 1, 0, 0, 30, tzinfo=dt.timezone.utc))
    maintenance = Maintenance([routine], _RaisingLock(), clock=clock)  # type: ignore[list-item]
    maintenance.start()
    [thread] = maintenance._threads
    try:
        for rounds in (0, 1, 2):  # raises on take; runs (release raises next); runs
            slot = clock.advance(60).replace(second=0)
            wait_until(
                lambda slot=slot: maintenance.considered("counting") == slot,
                message=f"the routine thread to deal with slot {slot}",
            )
            assert routine.rounds == rounds
            assert thread.is_alive()
    finally:
        maintenance.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "sqla_queue.maintenance"]
    assert any("the lock broke" in m for m in messages), messages
    assert any("the release broke" in m for m in messages), messages


# --------------------------------------------------------------------- capacity
def test_clients_beyond_max_client_threads_are_told_and_closed(
    mariadb: tuple[Engine, App, str],
) -> None:
    _, app, url = mariadb
    with running_server(RECORDING, url, app.Task.__table__.name, MAX_CLIENT_THREADS="3") as s:
        held = [s.connect(name=f"c{i}") for i in range(3)]
        try:
            with pytest.raises(ServerUnavailable, match="the server is full"):
                s.connect(name="one too many")
            held.pop().close()
            wait_until(lambda: _can_connect(s), timeout=10, message="a free place")
        finally:
            for conn in held:
                conn.close()


def _can_connect(server: ServerProcess) -> bool:
    try:
        server.connect().close()
    except ServerUnavailable:
        return False
    return True


def test_fifty_clients_and_abusers_while_a_worker_keeps_working(
    server: ServerProcess, mariadb: tuple[Engine, App, str]
) -> None:
    engine, app, url = mariadb
    env = {"SQLA_QUEUE_TEST_TABLE": app.Task.__table__.name, **server.env()}
    worker = spawn_cli("worker", RECORDING, "--url", url, "--log-level", "WARNING", env=env)
    errors: list[BaseException] = []
    rounds: list[int] = []
    start = threading.Barrier(51)

    def client(index: int) -> None:
        try:
            start.wait(timeout=30)
            with _closing(server.connect(name=f"c{index}")) as conn:
                for n in range(20):
                    assert lock(conn, f"c{index}")
                    assert lock(conn, "shared") in (True, False)
                    conn.request("unlock", name="shared")
                    assert conn.request("unlock", name=f"c{index}")["released"] is True
                    rounds.append(n)
        except BaseException as exc:
            errors.append(exc)

    def abusers() -> None:
        start.wait(timeout=30)
        for frame, _ in GARBAGE.values():
            with raw_socket(server.lock_port) as sock:
                sock.sendall(frame)
                read_until_closed(sock)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
    threads.append(threading.Thread(target=abusers))
    try:
        ids: list[int] = []
        for thread in threads:
            thread.start()
        for _ in range(5):  # tasks keep coming while the clients run
            with engine.begin() as conn:
                ids += QueueClient(conn, app.Task).insert_tasks(
                    {"process": "busy", "payload": {"n": n}} for n in range(40)
                )
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert len(rounds) == 50 * 20
        wait_until(lambda: _done(engine, app, ids), timeout=60, message="every task")
        with engine.connect() as conn:
            effects = conn.execute(select(app.Effect.task_id)).scalars().all()
        assert sorted(effects) == sorted(ids)  # each exactly once
        assert worker.poll() is None
    finally:
        worker.terminate()
        output = worker.communicate(timeout=30)[0]
    assert worker.returncode == 0, output


def _done(engine: Engine, app: App, ids: list[int]) -> bool:
    with engine.connect() as conn:
        statuses = dict(conn.execute(select(app.Task.id, app.Task.status)).all())
    return all(statuses.get(i) == "sucesso" for i in ids)


# --------------------------------------------------------------------- TLS
@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return make_certificate(tmp_path)


def test_tls_server_serves_verified_clients_and_survives_plain_ones(
    mariadb: tuple[Engine, App, str], certificate: tuple[Path, Path]
) -> None:
    _, app, url = mariadb
    cert, key = certificate
    tls = {"SQLA_QUEUE_SERVER_TLS_CERT": str(cert), "SQLA_QUEUE_SERVER_TLS_KEY": str(key)}
    server = ServerProcess(RECORDING, url, app.Task.__table__.name, tls_ca=str(cert), **tls)
    secure = server.settings
    server.start()
    try:
        routine = ServerRoutineLock(secure)
        assert routine.try_acquire("tls")
        routine.close()
        with raw_socket(server.lock_port) as sock:  # a plain client: no TLS handshake
            sock.sendall(encode({"op": "ping", "id": 1}))
            read_until_closed(sock)
        untrusted = dataclasses.replace(secure, tls_ca=None)  # the system's CAs only
        with pytest.raises(ServerUnavailable, match="TLS"):
            ServerConnection.open(untrusted, server.lock_port, client_name="x")
        assert server.answers()
    finally:
        server.kill()


# --------------------------------------------------------------------- the command
def assert_one_line_error(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SQLA_QUEUE_SERVER_SECRET": ""}, "Error: SQLA_QUEUE_SERVER_SECRET is not set"),
        ({"SQLA_QUEUE_SERVER_SECRET": "short"}, "Error: SQLA_QUEUE_SERVER_SECRET is too short"),
        ({"CHECK_TASKS_INTERVAL": "0"}, "Error: CHECK_TASKS_INTERVAL must be a number"),
        ({"MAX_CLIENT_THREADS": "lots"}, "Error: MAX_CLIENT_THREADS must be a whole number"),
        ({"TIMEOUT_SOCKET_MESSAGE": "nan"}, "Error: TIMEOUT_SOCKET_MESSAGE must be a number"),
        ({"NOTIFY_SERVICE_PORT": "70000"}, "Error: NOTIFY_SERVICE_PORT must be a whole number"),
        ({"SERVER_HOST": "a host"}, "Error: SERVER_HOST must be a host name"),
        ({"CLIENT_SERVER_MODE": "maybe"}, "Error: CLIENT_SERVER_MODE must be true or false"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_server_command_refuses_bad_settings_in_one_line(env: dict[str, str], message: str) -> None:
    full = {"SQLA_QUEUE_SERVER_SECRET": SECRET, "QUEUE_TABLE": "fila_x", **env}
    proc = run_cli("server", "--url", "sqlite:///:memory:", env=full, check=False, timeout=60)
    assert_one_line_error(proc, message)


def test_server_command_needs_a_queue_and_free_ports(server: ServerProcess) -> None:
    env = {"SQLA_QUEUE_SERVER_SECRET": SECRET, "QUEUE_TABLE": "", "SQLA_QUEUE_TEST_TABLE": "x"}
    proc = run_cli("server", "--url", "sqlite:///:memory:", env=env, check=False, timeout=60)
    assert_one_line_error(proc, "Error: which queue? give a worker as module:Class")
    busy = {**env, "QUEUE_TABLE": "fila_x"}
    proc = run_cli(
        "server",
        "--url",
        "sqlite:///:memory:",
        "--notify-port",
        str(server.notify_port),
        "--lock-port",
        "0",
        env=busy,
        check=False,
        timeout=60,
    )
    assert_one_line_error(proc, "Error: cannot listen on 127.0.0.1")


def test_server_stops_on_sigterm_and_frees_everything(mariadb: tuple[Engine, App, str]) -> None:
    _, app, url = mariadb
    server = ServerProcess(RECORDING, url, app.Task.__table__.name)
    server.start()
    conn = server.connect(name="holder")
    assert lock(conn, "held")
    assert server.stop() == 0
    with pytest.raises(ServerUnavailable):
        conn.request("ping")
    conn.close()
    assert "serving queue" in server.output
    assert SECRET not in server.output


# --------------------------------------------------------------------- odd text
@pytest.mark.parametrize("command", ["server", "worker"])
def test_a_secret_that_is_not_utf8_is_one_line_naming_the_variable(command: str) -> None:
    # bytes 0xff 0xfe in the environment: Python reads them as lone surrogates
    secret = "not-utf8-\udcff\udcfe-0123456789abcdef"
    env = {
        "SQLA_QUEUE_SERVER_SECRET": secret,
        "CLIENT_SERVER_MODE": "true",
        "QUEUE_TABLE": "fila_x",
        "SQLA_QUEUE_TEST_TABLE": "fila_x",
    }
    args = ["server"] if command == "server" else ["worker", RECORDING]
    proc = run_cli(*args, "--url", "sqlite:///:memory:", env=env, check=False, timeout=60)
    assert_one_line_error(proc, "Error: SQLA_QUEUE_SERVER_SECRET is not valid UTF-8")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "not-utf8" not in proc.stdout + proc.stderr


def test_a_lone_surrogate_in_the_answer_is_a_failed_authentication(server: ServerProcess) -> None:
    logged = len(server.output)
    with raw_socket(server.lock_port) as sock:
        receive(sock)
        sock.sendall(encode({"op": "auth", "mac": "\ud800" * 64, "client": "\udfff"}))
        assert error_then_close(sock) == "authentication failed"
    assert_served(server)
    assert "unexpected" not in server.output[logged:]
    assert " ERROR " not in server.output[logged:]
