"""The queue server under a flood of strangers and a stream of generated garbage.

A real ``sqla-queue server`` process (tests/support/queue_server.py) on a SQLite
queue. The flood: hundreds of connections that never authenticate (silent,
slow, or sending garbage; with TLS, stuck in the handshake), from several
source addresses (the whole of 127.0.0.0/8 is this host), held open and
reopened as the server drops them, bounded in connections opened and in
time. While it lasts, workers connected before it and workers connecting
during it must be served: take and release a routine lock, subscribe, be
woken. The server's file descriptors stay bounded, and its log says so in
a few lines, not one per refusal.

The fuzz: generated frames (random bytes, truncated and oversized frames,
invalid UTF-8 and JSON, JSON of every shape and type) before and after
authentication. The server answers each with a reply or an error frame, or
closes that connection; it never dies, never logs a traceback or an
"unexpected" error, and serves the next client. Short in ``make test``
(a fixed seed), long in ``make fuzz``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine

from sqla_queue.common.server_protocol import HEADER, MAX_BODY_BYTES, body_length, decode_body
from sqla_queue.server import ServerRoutineLock, ServerWakeups, notify_queue
from sqla_queue.server.admission import PER_ADDRESS, TOTAL, Admission, RefusalLog, address_key
from tests.conftest import fuzz_examples, wait_until
from tests.support.app import build
from tests.support.queue_server import (
    SECRET,
    ServerProcess,
    authenticated,
    make_certificate,
    raw_socket,
    receive,
)

RECORDING = "tests.support.app:RecordingWorker"
#: the flood's source addresses, each holding more than the per-address cap
#: (16) and all of them together more than the server's caps; the workers
#: connect from 127.0.0.1, where a few strangers wait too
FLOOD = {"127.0.0.1": 10, **{f"127.0.0.{n}": 40 for n in range(2, 7)}}
#: the server's default SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED
MAX_UNAUTHENTICATED = 64
#: rounds of new workers connecting during a flood: 5, or 50 under make fuzz
ROUNDS = max(5, fuzz_examples(200) // 100)
#: a refused or dropped stranger costs at most two lines per interval (the
#: first, and a summary); the flood lasts a few intervals at most
MAX_REFUSAL_LINES = 12 + ROUNDS // 5


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A queue table in a SQLite file: the server looks at it, nothing more."""
    path = tmp_path_factory.mktemp("flood") / "queue.db"
    url = f"sqlite:///{path}"
    app = build("fila_flood")
    engine = create_engine(url)
    app.Base.metadata.create_all(engine)
    engine.dispose()
    return url, "fila_flood"


@pytest.fixture(scope="module")
def server(queue: tuple[str, str]) -> Iterator[ServerProcess]:
    url, table = queue
    process = ServerProcess(RECORDING, url, table)
    process.start()
    try:
        yield process
    finally:
        process.kill()


# --------------------------------------------------------------------- the flood
class Flood:
    """Connections that never authenticate, held open from ``sources`` (so
    many from each address) and reopened as the server drops them, until :meth:`stop`, ``max_opens``
    connections or ``max_seconds``, whichever comes first. Each connection
    is silent, slow (the start of a frame, or of a TLS record, and nothing
    more) or sends garbage, in turn."""

    KINDS = ("silent", "slow", "garbage")

    def __init__(
        self,
        port: int,
        sources: dict[str, int],
        *,
        tls: bool,
        max_opens: int,
        max_seconds: float = 60.0,
    ) -> None:
        self.port = port
        self.slots = [
            (source, self.KINDS[n % 3]) for source, count in sources.items() for n in range(count)
        ]
        self.tls = tls
        self.max_opens = max_opens
        self.max_seconds = max_seconds
        self.opened = 0
        self.dropped = 0
        self.failed = 0
        self._stop = threading.Event()
        self._random = random.Random(23)
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _first_bytes(self, kind: str) -> bytes:
        if kind == "slow":  # never finished
            return b"\x16\x03\x01\x02" if self.tls else HEADER.pack(b"SQ", 1, 100)[:5]
        if kind == "garbage":
            return self._random.randbytes(self._random.randint(1, 64))
        return b""

    def _open(self, selector: selectors.BaseSelector, slot: int) -> None:
        """Start connecting (without waiting: a full accept queue must not
        stall the whole flood)."""
        source, _ = self.slots[slot]
        self.opened += 1
        sock = socket.socket()
        try:
            sock.bind((source, 0))
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            self.failed += 1
            return
        selector.register(sock, selectors.EVENT_WRITE, (slot, False))

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with selectors.DefaultSelector() as selector:
            for slot in range(len(self.slots)):
                self._open(selector, slot)
            while not self._stop.is_set() and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    slot, connected = key.data
                    if not connected:
                        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                            with contextlib.suppress(OSError):
                                sock.send(self._first_bytes(self.slots[slot][1]))
                            selector.modify(sock, selectors.EVENT_READ, (slot, True))
                            continue
                        self.failed += 1
                    else:
                        try:
                            if sock.recv(65536):
                                continue  # a challenge or an error: read, never answered
                        except BlockingIOError:
                            continue
                        except OSError:
                            pass
                        self.dropped += 1
                    selector.unregister(sock)
                    sock.close()
                    if self.opened < self.max_opens:
                        self._open(selector, slot)
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]


def _served_during_the_flood(server: ServerProcess, flood: Flood, channel: str) -> None:
    """Workers connected before the flood, and new ones, are served while it lasts."""
    settings = server.settings
    kept = ServerRoutineLock(settings, client_name="kept")
    assert kept.try_acquire("kept")  # connected before the flood
    subscriber_woken = threading.Event()
    subscriber = ServerWakeups(settings, channel, client_name="subscribed-before")
    subscriber.start(subscriber_woken)
    files = [server.open_files()]
    try:
        assert subscriber.listening.is_set()
        flood.start()
        saturated = 3 * len(flood.slots)
        wait_until(lambda: flood.opened >= saturated, timeout=60, message="the flood to churn")
        opened_before = flood.opened
        for round_ in range(ROUNDS):
            files.append(server.open_files())
            kept.release("kept")
            assert kept.try_acquire("kept"), "the kept connection lost its lock"
            fresh = ServerRoutineLock(settings, client_name=f"fresh-{round_}")
            try:
                assert fresh.try_acquire(f"purge-{round_}"), "a new worker's lock was refused"
                fresh.release(f"purge-{round_}")
            finally:
                fresh.close()
            woken = threading.Event()
            worker = ServerWakeups(settings, channel, client_name=f"worker-{round_}")
            worker.start(woken)
            try:
                assert worker.listening.wait(30), "a new worker could not subscribe"
                woken.clear()
                subscriber_woken.clear()
                assert notify_queue(settings, channel) >= 2
                assert woken.wait(30) and subscriber_woken.wait(30), "a wake-up went missing"
            finally:
                worker.stop()
            files.append(server.open_files())
        assert flood.opened > opened_before, "the flood stopped before the workers were done"
    finally:
        flood.stop()
        subscriber.stop()
        kept.close()
    # the strangers held at most the unauthenticated cap of sockets at once
    assert max(files) <= files[0] + MAX_UNAUTHENTICATED + 16, files


@pytest.mark.fuzz
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_flood_of_strangers_keeps_no_worker_out(
    queue: tuple[str, str], tmp_path: Path, tls: bool
) -> None:
    url, table = queue
    env: dict[str, str] = {}
    tls_ca = None
    if tls:
        cert, key = make_certificate(tmp_path)
        env = {"SQLA_QUEUE_SERVER_TLS_CERT": str(cert), "SQLA_QUEUE_SERVER_TLS_KEY": str(key)}
        tls_ca = str(cert)
    server = ServerProcess(RECORDING, url, table, tls_ca=tls_ca, **env)
    server.start()
    try:
        flood = Flood(
            server.lock_port,
            FLOOD,
            tls=tls,
            max_opens=fuzz_examples(200) * 100,
            max_seconds=60 + 5 * ROUNDS,
        )
        _served_during_the_flood(server, flood, table)
        assert server.answers()
        assert server.stop() == 0  # a graceful stop writes the last summary line
    finally:
        server.kill()
    output = server.output
    refusals = [line for line in output.splitlines() if "refused" in line]
    assert 2 <= len(refusals) <= MAX_REFUSAL_LINES, output[-5000:]
    assert "more connection(s) that did not authenticate" in refusals[-1]
    assert len(output.splitlines()) < 60 + ROUNDS, output[-5000:]
    assert "Traceback" not in output
    assert " ERROR " not in output
    assert SECRET not in output


# --------------------------------------------------------------------- the fuzz
def _frame(
    body: bytes, *, magic: bytes = b"SQ", version: int = 1, length: int | None = None
) -> bytes:
    return struct.pack("!2sBI", magic, version, len(body) if length is None else length) + body


#: any text, lone surrogates (valid in JSON's escapes, not in UTF-8) included
_text = st.text(st.characters(exclude_categories=()), max_size=70) | st.sampled_from(
    ["\ud800", "\udfff" * 64, "a\udc80b", "é" * 64, "0" * 64]
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _text,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
_ops = st.sampled_from(["lock", "unlock", "subscribe", "notify", "ping", "auth", "wake", "x"])
_fields = st.sampled_from(["op", "id", "name", "queue", "mac", "client", "nonce"])
_messages = (
    st.dictionaries(_fields, _json | _ops, max_size=6)
    | st.fixed_dictionaries({"op": _ops, "id": _json, "name": _json, "queue": _json})
    | st.fixed_dictionaries({"op": st.just("auth"), "mac": _text | _json, "client": _json})
)


def _body(message: object) -> bytes:
    return json.dumps(message, allow_nan=True).encode("utf-8", "surrogatepass")


_frames = st.one_of(
    st.binary(max_size=200),  # anything at all
    _messages.map(lambda m: _frame(_body(m))),  # well framed, any fields and types
    _json.map(lambda m: _frame(_body(m))),  # well framed, any JSON
    st.binary(max_size=100).map(_frame),  # well framed, any body (invalid UTF-8 and JSON)
    st.tuples(_messages, st.integers(1, 20)).map(  # cut short
        lambda pair: _frame(_body(pair[0]))[: -pair[1]]
    ),
    st.tuples(st.binary(max_size=50), st.integers(0, 2**32 - 1)).map(  # a length that lies
        lambda pair: _frame(pair[0], length=pair[1])
    ),
    st.tuples(st.binary(min_size=2, max_size=2), st.integers(0, 255), st.binary(max_size=40)).map(
        lambda t: _frame(t[2], magic=t[0], version=t[1])  # another magic or version
    ),
    st.just(_frame(b"[" * 100_000, length=MAX_BODY_BYTES + 1)),  # oversized
)


def _answers_or_closes(sock: socket.socket) -> None:
    """What the server sends after the frame, until it closes or goes quiet:
    well-formed frames only."""
    with contextlib.suppress(OSError):  # no more: the server sees the end at once
        sock.shutdown(socket.SHUT_WR)
    data = bytearray()
    sock.settimeout(30)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    while data:
        length = body_length(bytes(data[: HEADER.size]))
        message = decode_body(bytes(data[HEADER.size : HEADER.size + length]))
        assert message["op"] in ("challenge", "reply", "error", "wake", "ready"), message
        del data[: HEADER.size + length]


@pytest.mark.fuzz
def test_generated_frames_cost_the_sender_its_connection_and_nothing_more(
    server: ServerProcess,
) -> None:
    logged = len(server.output)

    @given(frames=st.lists(_frames, min_size=1, max_size=3), after_auth=st.booleans())
    def one_connection(frames: list[bytes], after_auth: bool) -> None:
        sock = authenticated(server.lock_port) if after_auth else raw_socket(server.lock_port)
        with sock:
            if not after_auth:
                assert receive(sock)["op"] == "challenge"
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"".join(frames))  # the server may close at the first bad frame
            _answers_or_closes(sock)

    one_connection()
    assert server.answers()
    routine = ServerRoutineLock(server.settings, client_name="after")
    try:
        assert routine.try_acquire("after-the-fuzz")
    finally:
        routine.close()
    output = server.output[logged:]
    assert "Traceback" not in output
    assert "unexpected" not in output
    assert " ERROR " not in output


# --------------------------------------------------------------------- the policies
def test_strangers_over_a_cap_drop_the_oldest_of_the_address_that_holds_the_most() -> None:
    admission: Admission[str] = Admission(max_total=5, max_per_address=3)
    assert admission.admit("a", "a1") == []
    assert admission.admit("a", "a2") == []
    assert admission.admit("a", "a3") == []
    assert admission.admit("a", "a4") == [("a1", PER_ADDRESS)]
    assert admission.admit("b", "b1") == []
    assert admission.admit("b", "b2") == []  # five in all
    # one more: the heaviest address (a) gives up its oldest, never b's
    assert admission.admit("c", "c1") == [("a2", TOTAL)]
    assert admission.leave("b", "b1") and not admission.leave("b", "b1")
    assert len(admission) == 4
    # every address down to one each: the longest present goes first
    small: Admission[str] = Admission(max_total=2, max_per_address=2)
    small.admit("x", "x1")
    small.admit("y", "y1")
    assert small.admit("z", "z1") == [("x1", TOTAL)]


def test_an_ipv6_host_counts_as_its_slash_64() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::2")
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:10.1.2.3") == "10.1.2.3" == address_key("10.1.2.3")
    assert address_key("fe80::1%eth0") == "fe80::/64"


def test_refusals_are_one_line_then_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = RefusalLog(logging.getLogger("sqla_queue.test"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "sqla_queue.test"):
        for n in range(10_000):  # a flood, over 25 s
            now[0] = n * 0.0025
            log.note(f"10.0.0.{n % 200}:{n}", "bad magic" if n % 2 else "too slow")
        log.flush()  # 5 s into the third interval: not yet
        now[0] = 100.0
        log.flush()  # the third interval's summary, late (nothing more came)
        now[0] = 200.0
        log.flush()  # a quiet interval: nothing to say
        log.note("10.0.0.1:1", "too slow")  # the first of a new spell: at once
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused 10.0.0.0:0: too slow (further refusals: one line every 10 s)",
        "refused 3999 more connection(s) that did not authenticate in the last 10 s: "
        "2000 bad magic, 1999 too slow",
        "refused 4000 more connection(s) that did not authenticate in the last 10 s: "
        "2000 too slow, 2000 bad magic",
        "refused 2000 more connection(s) that did not authenticate in the last 80 s: "
        "1000 too slow, 1000 bad magic",
        "refused 10.0.0.1:1: too slow (further refusals: one line every 10 s)",
    ]
