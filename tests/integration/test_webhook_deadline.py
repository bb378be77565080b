"""The webhook delivery's wall-clock deadline against a hostile server
(sqla_queue.webhooks.transport, sqla_queue.webhooks.delivery).

A raw TCP server on 127.0.0.1 reads each request and plays the script its
path names (``/s/NAME``): bytes sent whole or dripped a byte at a time, a
hang, a half-close, garbage, the next request on the same connection. With
a 1 s deadline, every hostile script ends in a failure within DEADLINE +
MARGIN (generous, for a loaded 2-core machine); a script whose response
never completes while the server keeps the connection open is a timeout,
reported only after the deadline really passed. A well-behaved server
succeeds under every framing: Content-Length (keep-alive), chunked,
HTTP/1.0 and ``Connection: close`` (with and without a length), dripped
quickly, after a 100 Continue, through a redirect, over TLS.

All the deliveries of a test run at once (threads): the test lasts about
one deadline, not one per case.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sqla_queue.webhooks.delivery import Delivery, DeliveryResult, WebhookClient
from sqla_queue.webhooks.guard import Destination
from sqla_queue.webhooks.transport import Call, GuardedHTTPSConnection, calling
from tests.conftest import fuzz_examples

#: the hostile deliveries' deadline, and how much later they may end at most
DEADLINE = 1.0
MARGIN = 4.0
#: the well-behaved deliveries' timeout (they take milliseconds)
PATIENT = 10.0
#: a dripping server sends one byte every DRIP seconds
DRIP = 0.05
#: the longest a server thread waits (the fixture's teardown releases it sooner)
HANG = 30.0
LOCAL = ("127.0.0.1/32",)
TIMEOUT = f"timeout: no complete response within {DEADLINE:g} s"

Step = tuple[Any, ...]
Script = list[Step]


# ------------------------------------------------------------ the server
class _Play(socketserver.BaseRequestHandler):
    """Reads requests and plays their scripts (the server's ``raw`` script
    at once, without reading anything, when it has one)."""

    server: _Hostile

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(HANG)
        try:
            if self.server.raw is not None:
                self._play(sock, self.server.raw)
                return
            if self.server.tls is not None:
                sock = self.server.tls.wrap_socket(sock, server_side=True)
            reader = sock.makefile("rb")
            while True:
                name = self._request(reader)
                if name is None or not self._play(sock, self.server.scripts[name]):
                    return
        except OSError:
            pass  # the client left (or shut the connection down): expected

    @staticmethod
    def _request(reader: Any) -> str | None:
        """The script name of the next request on the connection (None at its end)."""
        line = reader.readline()
        if not line:
            return None
        path = line.split()[1].decode()
        length = 0
        while True:
            header = reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length:
            reader.read(length)
        return path.rpartition("/")[2]

    def _play(self, sock: socket.socket, script: Script) -> bool:
        """Play ``script``; True to read the next request on this connection."""
        release = self.server.release
        for step in script:
            kind = step[0]
            if kind == "send":
                sock.sendall(step[1])
            elif kind == "pause":
                if release.wait(step[1]):
                    return False
            elif kind == "drip":  # one byte every DRIP seconds
                for byte in step[1]:
                    sock.sendall(bytes([byte]))
                    if release.wait(DRIP):
                        return False
            elif kind == "forever":  # drip these bytes again and again (for HANG s)
                stop = time.monotonic() + HANG
                while time.monotonic() < stop:
                    for byte in step[1]:
                        sock.sendall(bytes([byte]))
                        if release.wait(DRIP):
                            return False
                return False  # then close
            elif kind == "hang":  # keep the connection open, say nothing more
                release.wait(HANG)
                return False
            elif kind == "half_close":  # no more bytes, the connection stays open
                socket.socket.shutdown(sock, socket.SHUT_WR)
                release.wait(HANG)
                return False
            elif kind == "close":
                return False
            else:
                raise AssertionError(f"unknown step {kind!r}")
        return True


class _Hostile(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # every case connects at once: the default backlog (5) would make
    # connections wait for a SYN retransmission
    request_queue_size = 256

    def __init__(self, tls: ssl.SSLContext | None = None, raw: Script | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Play)
        self.tls = tls
        self.raw = raw
        self.scripts: dict[str, Script] = {}
        self.release = threading.Event()
        self.port = self.server_address[1]

    def url(self, name: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/s/{name}"


@contextmanager
def _serving(tls: ssl.SSLContext | None = None, raw: Script | None = None) -> Iterator[_Hostile]:
    server = _Hostile(tls, raw)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


# ------------------------------------------------------------ responses
@dataclass(frozen=True)
class Framing:
    """How a response's end is found."""

    version: str
    headers: tuple[str, ...]
    #: the body ends with the stream: the server closes after it
    eof: bool = False
    chunked: bool = False
    length: bool = False
    #: the server closes after the response (``Connection: close``, HTTP/1.0)
    closes: bool = False


FRAMINGS = {
    "content-length": Framing("HTTP/1.1", (), length=True),
    "chunked": Framing("HTTP/1.1", ("Transfer-Encoding: chunked",), chunked=True),
    "http1.0": Framing("HTTP/1.0", (), eof=True, closes=True),
    "http1.0+length": Framing("HTTP/1.0", (), length=True, closes=True),
    "close": Framing("HTTP/1.1", ("Connection: close",), eof=True, closes=True),
    "close+length": Framing("HTTP/1.1", ("Connection: close",), length=True, closes=True),
}
REASONS = {200: "OK", 201: "Created", 202: "Accepted", 302: "Found", 404: "Not Found"}
REASONS[500] = "Internal Server Error"


def _head(framing: Framing, status: int = 200, size: int = 0, extra: Sequence[str] = ()) -> bytes:
    """The status line and headers, without the blank line that ends them."""
    lines = [f"{framing.version} {status} {REASONS.get(status, 'X')}", *framing.headers, *extra]
    if framing.length:
        lines.append(f"Content-Length: {size}")
    return ("\r\n".join(lines) + "\r\n").encode()


def _chunks(parts: Sequence[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts if part) + b"0\r\n\r\n"


def _response(
    framing: Framing,
    body: bytes,
    status: int = 200,
    extra: Sequence[str] = (),
    parts: Sequence[bytes] | None = None,
) -> tuple[bytes, int]:
    """A whole response (the body in ``parts`` when chunked), and where its head ends."""
    head = _head(framing, status, len(body), extra) + b"\r\n"
    if framing.chunked:
        return head + _chunks(parts if parts is not None else [body]), len(head)
    return head + body, len(head)


def _whole(framing: Framing, body: bytes, status: int = 200, **kw: Any) -> Script:
    """A well-behaved answer: the response, and the close its framing needs."""
    data, _ = _response(framing, body, status, **kw)
    return [("send", data)] + ([("close",)] if framing.closes else [])


# ------------------------------------------------------------ delivering
@dataclass
class Outcome:
    name: str
    result: DeliveryResult
    elapsed: float


def _deliver_all(client: WebhookClient, urls: dict[str, str]) -> dict[str, Outcome]:
    """Every URL delivered at once, each timed on its own."""

    def one(item: tuple[str, str]) -> Outcome:
        name, url = item
        started = time.monotonic()
        result = client.deliver(
            Delivery(url=url, http_method="POST", body='{"a": 1}', delivery_id="d-" + name)
        )
        return Outcome(name, result, time.monotonic() - started)

    if not urls:
        return {}
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return {o.name: o for o in pool.map(one, urls.items())}


@contextmanager
def _client(timeout: float, concurrency: int) -> Iterator[WebhookClient]:
    with WebhookClient(timeout, allowed_networks=LOCAL, max_concurrency=concurrency) as client:
        yield client


def _problems(outcome: Outcome, expect: str, body: bytes | None = None) -> list[str]:
    """What is wrong with ``outcome``. ``expect``: "timeout" (the response
    never completes, the connection stays open), "failure" (anything but a
    success), "any" (a success or not, in time), "ok" (a success showing
    ``body``) or "status:N" (a failure with status N)."""
    result = outcome.result
    problems = []
    if "\n" in result.message:
        problems.append("a line break in the message")
    if expect in ("timeout", "failure", "any"):
        if outcome.elapsed > DEADLINE + MARGIN:
            problems.append(f"ended after {outcome.elapsed:.2f} s")
        if result.ok and expect != "any":
            problems.append("a success")
        if expect == "timeout":
            if TIMEOUT not in result.message:
                problems.append("not a timeout")
            if outcome.elapsed < DEADLINE:  # a timeout before the deadline is no timeout
                problems.append(f"a timeout after only {outcome.elapsed:.2f} s")
    elif expect == "ok":
        if not result.ok:
            problems.append("not a success")
        elif body is not None and body.decode().strip() not in result.message:
            problems.append("not the body sent")
    else:
        status = int(expect.partition(":")[2])
        if result.ok or result.status != status:
            problems.append(f"not a failure with status {status}")
    return problems


def _check_hostile(outcomes: dict[str, Outcome], expected: dict[str, str]) -> None:
    wrong = []
    for name, expect in expected.items():
        problems = _problems(outcomes[name], expect)
        if problems:
            wrong.append(f"{name}: {', '.join(problems)}: {outcomes[name].result.message}")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------ hostile servers
def _hostile_cases() -> dict[str, tuple[Script, str]]:
    """name -> (script, "timeout" | "failure")."""
    cases: dict[str, tuple[Script, str]] = {
        "accept-never-answer": ([("hang",)], "timeout"),
        "status-line-dripped": ([("send", b"HTTP/1.1 200 "), ("forever", b"K")], "timeout"),
        "status-line-dripped-http1.0": ([("send", b"HTTP/1.0 200 "), ("forever", b"K")], "timeout"),
        "status-line-whole-then-hang": ([("drip", b"HTTP/1.1 200 OK\r\n"), ("hang",)], "timeout"),
        "endless-100-continue": ([("forever", b"HTTP/1.1 100 Continue\r\n\r\n")], "timeout"),
        "garbage-line": ([("send", b"\x00\xff\x16\x03garbage\r\n"), ("hang",)], "failure"),
        "garbage-no-line-end": ([("send", b"\x16\x03\x01\x02\x00"), ("hang",)], "timeout"),
        "garbage-forever": ([("forever", bytes(range(1, 10)))], "timeout"),
        "garbage-then-close": ([("send", b"\x00\x01\x02\x03garbage"), ("close",)], "failure"),
        "invalid-status": ([("send", b"HTTP/1.1 abc OK\r\n\r\n"), ("hang",)], "failure"),
        "half-close-at-once": ([("half_close",)], "failure"),
        "close-at-once": ([("close",)], "failure"),
        "status-line-then-half-close": (
            [("send", b"HTTP/1.1 200 OK\r\n"), ("half_close",)],
            "failure",
        ),
        "half-status-line-then-half-close": (
            [("send", b"HTTP/1.1 20"), ("half_close",)],
            "failure",
        ),
        "redirect-then-drip": (
            [
                ("send", b"HTTP/1.1 302 Found\r\nLocation: /s/close-body-dripped\r\n"),
                ("send", b"Content-Length: 0\r\n\r\n"),
            ],
            "timeout",
        ),
    }
    for key, framing in FRAMINGS.items():
        big = _head(framing, 200, 10**6)  # a body that would take a day to drip
        chunked = framing.chunked
        filler = b"1\r\nx\r\n" if chunked else b"x"
        cases[f"{key}-headers-dripped"] = (
            [("send", big), ("forever", b"X-Drip: 1\r\n")],
            "timeout",
        )
        cases[f"{key}-header-line-dripped"] = (
            [("send", big + b"X-Drip: "), ("forever", b"x")],
            "timeout",
        )
        cases[f"{key}-half-header-then-half-close"] = (
            [("send", big + b"X-Half: ab"), ("half_close",)],
            "failure",
        )
        cases[f"{key}-head-then-hang"] = ([("send", big + b"\r\n"), ("hang",)], "timeout")
        cases[f"{key}-body-dripped"] = ([("send", big + b"\r\n"), ("forever", filler)], "timeout")
        cases[f"{key}-body-then-hang"] = (
            [("send", big + b"\r\n" + (b"3\r\nabc\r\n" if chunked else b"abc")), ("hang",)],
            "timeout",
        )
        if not framing.eof:  # a body read to the end of the stream cannot be cut short
            cases[f"{key}-body-then-half-close"] = (
                [
                    ("send", big + b"\r\n" + (b"3\r\nabc\r\n" if chunked else b"abc")),
                    ("half_close",),
                ],
                "failure",
            )
    head = _head(FRAMINGS["chunked"]) + b"\r\n"
    cases["chunked-size-line-dripped"] = ([("send", head + b"1"), ("forever", b"0")], "timeout")
    cases["chunked-trailers-dripped"] = (
        [("send", head + b"3\r\nabc\r\n0\r\n"), ("forever", b"X-Trailer: 1\r\n")],
        "timeout",
    )
    cases["chunked-garbage-size"] = ([("send", head + b"zz\r\nabc\r\n"), ("hang",)], "failure")
    cases["chunked-half-chunk-then-half-close"] = (
        [("send", head + b"a\r\nabc"), ("half_close",)],
        "failure",
    )
    cases["close-body-dripped"] = (
        [("send", _head(FRAMINGS["close"]) + b"\r\n"), ("forever", b"x")],
        "timeout",
    )
    return cases


def test_a_hostile_server_never_gets_a_success_nor_holds_past_the_deadline():
    cases = _hostile_cases()
    with _serving() as server, _client(DEADLINE, len(cases)) as client:
        server.scripts.update({name: script for name, (script, _) in cases.items()})
        outcomes = _deliver_all(client, {name: server.url(name) for name in cases})
    _check_hostile(outcomes, {name: kind for name, (_, kind) in cases.items()})
    # what went wrong is said
    cut = outcomes["status-line-then-half-close"].result.message
    assert "ended inside the response's status line or headers" in cut
    body = outcomes["content-length-body-dripped"].result
    assert body.status == 200 and "the body incomplete" in body.message
    half = outcomes["content-length-body-then-half-close"].result.message
    assert "incomplete or malformed response body" in half


# ------------------------------------------------------------ well-behaved servers
def test_a_well_behaved_server_succeeds_under_every_framing():
    cases: dict[str, Script] = {}
    for key, framing in FRAMINGS.items():
        body = f"fine {key}".encode()
        cases[key] = _whole(framing, body, parts=[body[:3], body[3:]])
        data, _ = _response(framing, body, 201, parts=[body[:3], body[3:]])
        # a byte at a time, quickly (5 ms apart: ~0.5 s in all)
        cases[f"{key}-dripped"] = (
            [("send", data[:-40])]
            + [step for byte in data[-40:] for step in (("send", bytes([byte])), ("pause", 0.005))]
            + ([("close",)] if framing.closes else [])
        )
        cases[f"{key}-after-100-continue"] = [
            ("send", b"HTTP/1.1 100 Continue\r\n\r\n"),
            *_whole(framing, body),
        ]
        cases[f"{key}-500"] = _whole(framing, b"broken", 500)
    cases["redirect"] = [
        ("send", b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /s/chunked\r\n"),
        ("send", b"Content-Length: 0\r\n\r\n"),
    ]
    with _serving() as server, _client(PATIENT, len(cases)) as client:
        server.scripts.update(cases)
        outcomes = _deliver_all(client, {name: server.url(name) for name in cases})
        # one keep-alive connection serves deliveries one after another
        again = _deliver_all(client, {"content-length": server.url("content-length")})
    wrong = []
    for name, outcome in {**outcomes, "again": again["content-length"]}.items():
        result = outcome.result
        key = name.split("-dripped")[0].split("-after")[0].split("-500")[0]
        if name.endswith("-500"):
            good = not result.ok and result.status == 500 and "broken" in result.message
        else:
            good = result.ok and result.status in (200, 201)
            good = good and (f"fine {key}" in result.message or name in ("redirect", "again"))
        if not good:
            wrong.append(f"{name}: {result.message}")
    assert not wrong, "\n".join(wrong)
    assert "fine chunked" in outcomes["redirect"].result.message


# ------------------------------------------------------------ TLS
@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (made by the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt"),
            *("ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"),
            *("-keyout", str(key), "-out", str(cert)),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_the_deadline_holds_over_tls(certificate, monkeypatch):
    cert, key = certificate
    # requests takes the CA bundle from the environment first
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    close, length = FRAMINGS["close"], FRAMINGS["content-length"]
    hostile: dict[str, tuple[Script, str]] = {
        "close-body-dripped": ([("send", _head(close) + b"\r\n"), ("forever", b"x")], "timeout"),
        "http1.0-body-dripped": (
            [("send", _head(FRAMINGS["http1.0"]) + b"\r\n"), ("forever", b"x")],
            "timeout",
        ),
        "length-body-dripped": (
            [("send", _head(length, 200, 10**6) + b"\r\n"), ("forever", b"x")],
            "timeout",
        ),
        "headers-dripped": ([("send", _head(close)), ("forever", b"X-Drip: 1\r\n")], "timeout"),
        "status-line-dripped": ([("send", b"HTTP/1.1 200 "), ("forever", b"K")], "timeout"),
    }
    well = {
        "close": _whole(close, b"fine close"),
        "chunked": _whole(FRAMINGS["chunked"], b"fine chunked", parts=[b"fine ", b"chunked"]),
        "length": _whole(length, b"fine length"),
    }
    # TLS handshakes that never end: no answer at all, a record dripped
    handshakes = {
        "handshake-never-answered": [("hang",)],
        "handshake-dripped": [("send", b"\x16\x03\x03\x40\x00"), ("forever", b"\x02")],
    }
    with (
        _serving(tls=context) as server,
        _client(DEADLINE, len(hostile) + len(handshakes)) as client,
        _client(PATIENT, len(well)) as patient,
        _serving(raw=handshakes["handshake-never-answered"]) as silent,
        _serving(raw=handshakes["handshake-dripped"]) as dripping,
    ):
        server.scripts.update({name: script for name, (script, _) in hostile.items()})
        server.scripts.update(well)
        urls = {name: server.url(name, "https") for name in hostile}
        urls["handshake-never-answered"] = silent.url("x", "https")
        urls["handshake-dripped"] = dripping.url("x", "https")
        with ThreadPoolExecutor(2) as both:
            bad = both.submit(_deliver_all, client, urls)
            good = both.submit(
                _deliver_all, patient, {name: server.url(name, "https") for name in well}
            )
            outcomes, fine = bad.result(), good.result()
    expected = {name: kind for name, (_, kind) in hostile.items()}
    _check_hostile(outcomes, {**expected, **dict.fromkeys(handshakes, "timeout")})
    for name, outcome in fine.items():
        assert outcome.result.ok and f"fine {name}" in outcome.result.message, outcome


def test_the_watchdog_cuts_a_tls_handshake_whatever_the_socket_timeout():
    """ssl detaches the socket object from its descriptor while it wraps
    it: the watchdog still cuts a dripped handshake at the deadline (the
    socket's own timeout, 30 s here, would bound it only as a whole)."""
    dripped = [("send", b"\x16\x03\x03\x40\x00"), ("forever", b"\x02")]
    with _serving(raw=dripped) as server:
        call = Call(time.monotonic() + DEADLINE, str)
        call.destination = Destination("https", "127.0.0.1", server.port)
        call.addresses = ["127.0.0.1"]
        started = time.monotonic()
        with calling(call), pytest.raises(OSError):
            GuardedHTTPSConnection("127.0.0.1", server.port, timeout=HANG).connect()
        elapsed = time.monotonic() - started
    assert call.expired
    assert DEADLINE <= elapsed < DEADLINE + MARGIN


# ------------------------------------------------------------ fuzz
def _pieces(rng: random.Random, data: bytes) -> Script:
    """``data`` in a few sends, a few milliseconds apart."""
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 4))))
    steps: Script = []
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        steps += [("send", data[start:end]), ("pause", rng.uniform(0, 0.01))]
    return steps


def _scenario(rng: random.Random) -> tuple[Script, str, bytes]:
    """A random response under a random framing, then what the server does
    with it: send it whole (expect "ok" or "status:N"), or cut it at a
    random byte and then hang, drip a few more bytes and hang, half-close,
    or send garbage without a line end ("timeout" or "failure"; "any" when
    a half-close ends a body read to the end of the stream, or a chunked
    body after its last chunk: complete responses as far as HTTP can tell).
    And the body."""
    framing = FRAMINGS[rng.choice(sorted(FRAMINGS))]
    status = rng.choice([200, 201, 202, 404, 500])
    body = bytes(rng.choice(b"abcxyz 0123{}:,") for _ in range(rng.randint(0, 120)))
    extra = [f"X-F{i}: {'v' * rng.randint(0, 20)}" for i in range(rng.randint(0, 3))]
    parts: list[bytes] = []
    rest = body
    while rest:
        size = rng.randint(1, len(rest))
        parts.append(rest[:size])
        rest = rest[size:]
    data, head_end = _response(framing, body, status, extra, parts)
    mode = rng.choice(["complete", "complete", "hang", "drip", "half_close", "garbage"])
    if mode == "complete":
        expect = "ok" if status < 300 else f"status:{status}"
        return _pieces(rng, data) + ([("close",)] if framing.closes else []), expect, body
    cut = rng.randrange(0, head_end if mode == "garbage" else len(data) - 1)
    steps = _pieces(rng, data[:cut]) if cut else []
    if mode == "hang":
        return [*steps, ("hang",)], "timeout", body
    if mode == "drip":  # a few more bytes, never the last one
        more = data[cut : cut + rng.randint(1, min(5, len(data) - 1 - cut))]
        return [*steps, ("drip", more), ("hang",)], "timeout", body
    if mode == "garbage":
        junk = bytes(rng.choice([b for b in range(256) if b != 0x0A]) for _ in range(8))
        end = rng.choice(["hang", "half_close"])
        return [*steps, ("send", junk), (end,)], "timeout" if end == "hang" else "failure", body
    last_chunk = data.rfind(b"0\r\n\r\n") + 1 if framing.chunked else len(data)
    legit = (framing.eof and cut >= head_end) or (framing.chunked and cut >= last_chunk)
    return [*steps, ("half_close",)], "any" if legit else "failure", body


FUZZ_SCENARIOS = max(64, fuzz_examples(64) // 5)
FUZZ_BATCH = 32


@pytest.mark.fuzz
def test_fuzz_the_transport_with_a_hostile_server():
    """Random responses, cut and mangled at random bytes: no success that
    HTTP would not call complete, no delivery past the deadline + MARGIN,
    and every complete response delivered (its status, its body)."""
    random_run = os.environ.get("SQLA_QUEUE_FUZZ_EXAMPLES") is not None
    seed = random.randrange(2**32) if random_run else 20261129
    rng = random.Random(seed)
    scenarios = {f"f{i}": _scenario(rng) for i in range(FUZZ_SCENARIOS)}
    names = sorted(scenarios)
    wrong: list[str] = []
    with (
        _serving() as server,
        _client(DEADLINE, FUZZ_BATCH) as client,
        _client(PATIENT, FUZZ_BATCH) as patient,
    ):
        server.scripts.update({name: script for name, (script, _, _) in scenarios.items()})
        for start in range(0, len(names), FUZZ_BATCH):
            batch = names[start : start + FUZZ_BATCH]
            whole = {n for n in batch if scenarios[n][1] == "ok" or "status:" in scenarios[n][1]}
            with ThreadPoolExecutor(2) as both:
                good = both.submit(_deliver_all, patient, {n: server.url(n) for n in whole})
                bad = both.submit(
                    _deliver_all, client, {n: server.url(n) for n in batch if n not in whole}
                )
                outcomes = {**good.result(), **bad.result()}
            for name in batch:
                script, expect, body = scenarios[name]
                problems = _problems(outcomes[name], expect, body)
                if problems:
                    message = outcomes[name].result.message
                    wrong.append(f"{name} {expect}: {', '.join(problems)}: {script!r} -> {message}")
    assert not wrong, f"seed {seed}:\n" + "\n".join(wrong[:10])


# ------------------------------------------------------------ the watchdog's sockets
def test_a_call_shuts_down_only_the_sockets_it_still_holds():
    mine, mine_peer = socket.socketpair()
    lent, lent_peer = socket.socketpair()
    first = Call(time.monotonic() + 60, str)
    second = Call(time.monotonic() + 60, str)
    try:
        for sock in (mine, lent):
            sock.settimeout(5)
        first.watch(mine)
        first.watch(lent)
        second.watch(lent)  # back in the pool, taken by another delivery
        first.expire()
        assert first.expired and not second.expired
        assert mine.recv(1) == b""  # shut down: a blocked read would return at once
        lent_peer.sendall(b"x")
        assert lent.recv(1) == b"x"  # still the other delivery's
        second.finish()
        second.expire()  # a finished call's deadline shuts nothing
        lent_peer.sendall(b"y")
        assert lent.recv(1) == b"y"
    finally:
        for sock in (mine, mine_peer, lent, lent_peer):
            sock.close()


def test_a_response_that_ends_after_the_deadline_is_not_in_time():
    late = Call(time.monotonic() - 0.001, str)
    assert late.in_time() is False and late.expired
    on_time = Call(time.monotonic() + 60, str)
    sock, peer = socket.socketpair()
    try:
        on_time.watch(sock)
        assert on_time.in_time() is True
        on_time.expire()  # given up: its connection may serve another call now
        peer.sendall(b"z")
        sock.settimeout(5)
        assert sock.recv(1) == b"z"
    finally:
        sock.close()
        peer.close()
