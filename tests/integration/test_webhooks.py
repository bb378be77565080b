"""Webhook delivery (sqla_queue.webhooks.delivery) against real HTTP servers on 127.0.0.1.

Each server is a ThreadingHTTPServer in a thread; what a handler does is
chosen by the request path:

- ``/status/CODE``: that status, body ``status CODE`` (none for 204)
- ``/echo`` and ``/echo/CODE``: a JSON echo of the method, path, headers and body
- ``/slow``: waits for the server's ``release`` event (set at teardown)
- ``/sleep/SECONDS``: answers after that long, counting requests in flight
- ``/redirect?to=URL&code=CODE``: a redirect (302 unless ``code``)
- ``/chain/N``: N redirects in a row to ``/chain/N-1``, then ``/chain/0`` answers 200
- ``/huge``: 10 MB, streamed
- ``/cookie``: 200 with a Set-Cookie
- ``/drip/headers`` and ``/drip/body``: one byte at a time (DRIP_SECONDS apart)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from requests.adapters import HTTPAdapter
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from urllib3.util import parse_url

from sqla_queue.common.exceptions import ConfigurationError
from sqla_queue.webhooks.delivery import (
    MAX_RESPONSE_BYTES,
    MESSAGE_LIMIT,
    Delivery,
    WebhookClient,
    allowed_networks_from_env,
    block_private_networks_from_env,
    sign,
    webhook_timeout_from_env,
)
from sqla_queue.webhooks.guard import AddressPolicy, Destination, Refused, parse_destination
from sqla_queue.webhooks.transport import Call, GuardedHTTPConnection, calling

TOKEN = "tok-3f9a1c77e2b54d0d9b1e"  # a header value the servers echo back
SECRET_KEY = b"0123456789abcdef0123456789abcdef"
SIGNING_SECRET = "whsec_" + base64.b64encode(SECRET_KEY).decode()
HUGE = 10 * 1024 * 1024
# the test servers' network, let through the guard (on by default)
LOCAL = ("127.0.0.1/32",)
# a dripping endpoint sends one byte every DRIP_SECONDS, for about 40 s in all
DRIP_SECONDS = 0.2
DRIP_BYTES = 200
# secrets that ride in subscription URLs (a Slack-style path, an Azure-style key)
SLACK_PATH = "/services/T0SECRET1/B0SECRET2/XyZsEcReTsLaCkToKeN123"
AZURE_KEY = "AzFuncKeySecret-9f8e7d6c5b4a"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # headers and body are two writes: with Nagle on, each response waits 40 ms
    # for the client's delayed ACK
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        parts = urlsplit(self.path)
        record = {
            "method": self.command,
            "path": parts.path,
            "query": parts.query,
            "headers": dict(self.headers.items()),
            "body": body,
            "at": time.monotonic(),
        }
        with self.server.lock:
            self.server.received.append(record)
        segments = parts.path.strip("/").split("/")
        kind = segments[0]
        if kind == "status":
            code = int(segments[1])
            self._send(code, b"" if code == 204 else f"status {code}".encode())
        elif kind == "echo":
            code = int(segments[1]) if len(segments) > 1 and segments[1].isdigit() else 200
            self._send(code, json.dumps(record).encode(), {"Content-Type": "application/json"})
        elif kind == "slow":
            self.server.release.wait(30)
            self._send(200, b"late")
        elif kind == "sleep":
            with self.server.lock:
                self.server.in_flight += 1
                self.server.max_in_flight = max(self.server.max_in_flight, self.server.in_flight)
            time.sleep(float(segments[1]))
            with self.server.lock:
                self.server.in_flight -= 1
            self._send(200, b"slept")
        elif kind == "redirect":
            query = parse_qs(parts.query)
            code = int(query.get("code", ["302"])[0])
            self._send(code, b"moved", {"Location": query["to"][0]})
        elif kind == "chain":
            left = int(segments[1])
            if left:
                self._send(302, b"", {"Location": f"/chain/{left - 1}"})
            else:
                self._send(200, b"end of chain")
        elif kind == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                for _ in range(HUGE // len(chunk)):
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif kind == "cookie":
            self._send(200, b"cookie set", {"Set-Cookie": "session=abc123; Path=/"})
        elif kind == "drip":
            self._drip(segments[1])
        else:
            self._send(404, b"no such path")

    def _drip(self, part: str) -> None:
        """One byte every DRIP_SECONDS, for DRIP_BYTES bytes: of the headers
        (a header line that never ends) or of the body (after whole headers)."""
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % DRIP_BYTES
        if part == "body":
            self.wfile.write(head + b"\r\n")
        else:
            self.wfile.write(head + b"X-Drip: ")
        try:
            for _ in range(DRIP_BYTES):
                self.wfile.write(b"x")
                self.wfile.flush()
                if self.server.release.wait(DRIP_SECONDS):
                    break
        except OSError:
            pass  # the client gave up: what the test wants
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.lock = threading.Lock()
        self.received: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = self.server_address[1]
        self.base = f"http://{host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a "slow" answer to a client that timed out and left: expected, not
        # a traceback on the suite's output; anything else still prints
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _start(host: str = "127.0.0.1", port: int = 0) -> Iterator[_Server]:
    server = _Server(host, port)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def client() -> Iterator[WebhookClient]:
    with WebhookClient(timeout=5, allowed_networks=LOCAL) as webhook_client:
        yield webhook_client


def _delivery(url: str, method: str = "POST", body: str | None = '{"a": 1}', **kw: Any) -> Delivery:
    return Delivery(url=url, http_method=method, body=body, delivery_id=kw.pop("id", "d-1"), **kw)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------ outcomes
@pytest.mark.parametrize("code", [200, 201, 204])
def test_2xx_is_success_with_the_references_message(server, client, code):
    result = client.deliver(_delivery(server.url(f"/status/{code}")))
    assert result.ok and result.status == code
    text = "" if code == 204 else f"status {code}"
    assert result.message == (
        f"Webhook disparado com sucesso na URL: {server.url('/***')}. "
        f"Método HTTP: POST. Status Resposta: {code}. Mensagem: {text}."
    )


@pytest.mark.parametrize("code", [400, 404, 422, 500, 503])
def test_4xx_and_5xx_fail_with_status_and_body(server, client, code):
    result = client.deliver(_delivery(server.url(f"/status/{code}")))
    assert not result.ok and result.status == code
    assert f"Status Resposta: {code}" in result.message
    assert f"status {code}" in result.message


def test_a_long_body_is_cut_to_fit_the_message(server, client):
    body = json.dumps({"text": "y" * 5000})
    result = client.deliver(_delivery(server.url("/echo/500"), body=body))
    assert not result.ok and len(result.message) == MESSAGE_LIMIT
    assert result.message.endswith("….")
    ok = client.deliver(_delivery(server.url("/echo"), body=body))
    assert ok.ok and len(ok.message) == MESSAGE_LIMIT


def test_timeout(server):
    with WebhookClient(timeout=0.5, allowed_networks=LOCAL) as slow_client:
        started = time.monotonic()
        result = slow_client.deliver(_delivery(server.url("/slow")))
    assert time.monotonic() - started < 3
    assert not result.ok and result.status is None
    assert "timeout" in result.message


def test_connection_refused(client):
    result = client.deliver(_delivery(f"http://127.0.0.1:{_closed_port()}/x"))
    assert not result.ok and result.status is None
    assert "connection refused" in result.message


def test_dns_failure(client):
    result = client.deliver(_delivery("http://no-such-host.invalid/x"))
    assert not result.ok and "DNS failure" in result.message


def test_tls_error(server, client):
    # a TLS handshake with a plain HTTP server fails
    result = client.deliver(_delivery(f"https://127.0.0.1:{server.port}/status/200"))
    assert not result.ok and result.status is None
    assert "TLS error" in result.message


def test_unsupported_method_makes_no_request(server, client):
    for method in ("TRACE", "HEAD", "", "CONNECT"):
        result = client.deliver(_delivery(server.url("/echo"), method=method))
        assert not result.ok and "unsupported HTTP method" in result.message
    assert server.received == []


def test_a_url_that_is_not_http_fails_without_a_request(client):
    for url in ("ftp://127.0.0.1/x", "127.0.0.1:80/x", "http:///nohost"):
        result = client.deliver(_delivery(url))
        assert not result.ok, url


# ------------------------------------------------------------ the request
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "post", "Patch"])
def test_each_method_sends_the_body_and_headers(server, client, method):
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Tenant": "47", "X-Number": 5}
    body = '{"order": 12, "status": "paid"}'
    result = client.deliver(
        _delivery(server.url("/echo"), method=method, body=body, headers=headers)
    )
    assert result.ok
    (got,) = server.received
    assert got["method"] == method.upper()
    assert got["body"] == body
    assert got["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert got["headers"]["X-Tenant"] == "47"
    assert got["headers"]["X-Number"] == "5"
    assert got["headers"]["Content-Type"] == "application/json"
    assert got["headers"]["webhook-id"] == "d-1"
    assert "webhook-signature" not in got["headers"]


def test_content_type_from_the_subscription_wins(server, client):
    headers = {"content-type": "application/vnd.acme+json"}
    assert client.deliver(_delivery(server.url("/echo"), headers=headers)).ok
    got = server.received[0]["headers"]
    assert [v for k, v in got.items() if k.lower() == "content-type"] == [
        "application/vnd.acme+json"
    ]


def test_plain_text_payload_is_text_plain_and_no_payload_no_body(server, client):
    assert client.deliver(_delivery(server.url("/echo"), body="just words")).ok
    assert client.deliver(_delivery(server.url("/echo"), body=None)).ok
    text, empty = server.received
    assert text["body"] == "just words"
    assert text["headers"]["Content-Type"] == "text/plain; charset=utf-8"
    assert empty["body"] == "" and "Content-Type" not in empty["headers"]


def test_get_turns_a_json_object_into_the_query_string(server, client):
    body = json.dumps({"a": 1, "b": "x y&z", "c": [1, 2], "d": None, "e": True, "f": {"g": 1}})
    result = client.deliver(_delivery(server.url("/echo?fixed=1"), method="GET", body=body))
    assert result.ok
    (got,) = server.received
    assert got["method"] == "GET" and got["body"] == ""
    assert "Content-Type" not in got["headers"]
    assert parse_qs(got["query"], keep_blank_values=True) == {
        "fixed": ["1"],
        "a": ["1"],
        "b": ["x y&z"],
        "c": ["1", "2"],
        "d": [""],
        "e": ["true"],
        "f": ['{"g":1}'],
    }


@pytest.mark.parametrize("body", ["[1, 2]", '"text"', "12", "not json"])
def test_get_with_a_payload_that_is_no_object_fails_clearly(server, client, body):
    result = client.deliver(_delivery(server.url("/echo"), method="GET", body=body))
    assert not result.ok and "a GET needs a JSON object payload" in result.message
    assert server.received == []


def test_get_without_payload_sends_no_query(server, client):
    assert client.deliver(_delivery(server.url("/echo"), method="GET", body=None)).ok
    assert server.received[0]["query"] == ""


def test_a_header_value_with_a_line_break_fails_without_showing_it(server, client):
    headers = {"X-Token": f"{TOKEN}\r\nX-Evil: 1"}
    result = client.deliver(_delivery(server.url("/echo"), headers=headers))
    assert not result.ok and "X-Token holds a line break" in result.message
    assert TOKEN not in result.message and server.received == []


def test_a_header_value_outside_latin1_fails_without_showing_it(server, client):
    delivery = _delivery(server.url("/echo"), headers={"Authorization": "Bearer tok…en"})
    result = client.deliver(delivery)
    assert not result.ok and not server.received
    assert "header Authorization holds a character outside Latin-1" in result.message
    assert "tok" not in result.message


def test_no_cookie_is_kept_between_deliveries(server, client):
    assert client.deliver(_delivery(server.url("/cookie"))).ok
    assert client.deliver(_delivery(server.url("/echo"))).ok
    assert "Cookie" not in server.received[1]["headers"]


# ------------------------------------------------------------ redirects
def test_redirect_to_the_same_origin_is_followed(server, client):
    target = server.url("/echo")
    headers = {"Authorization": TOKEN}
    for code in (307, 308):
        result = client.deliver(
            _delivery(server.url(f"/redirect?code={code}&to=/echo"), headers=headers)
        )
        assert result.ok and result.status == 200
    assert client.deliver(_delivery(server.url(f"/redirect?to={target}"))).ok
    followed = [r for r in server.received if r["path"] == "/echo"]
    assert [r["method"] for r in followed] == ["POST", "POST", "GET"]  # 302 after POST: GET
    assert followed[0]["headers"]["Authorization"] == TOKEN
    assert followed[0]["body"] == '{"a": 1}'


def test_at_most_five_redirects(server, client):
    assert client.deliver(_delivery(server.url("/chain/5"))).ok
    result = client.deliver(_delivery(server.url("/chain/6")))
    assert not result.ok and result.status == 302
    assert "too many redirects" in result.message


def test_redirect_to_another_origin_is_refused(server, other_server, client):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for target in (other_server.url("/echo"), f"http://localhost:{server.port}/echo"):
        url = server.url(f"/redirect?to={target}")
        result = client.deliver(_delivery(url, headers=headers))
        assert not result.ok and result.status == 302
        origin = "/".join(target.split("/")[:3])
        assert f"redirect to another origin refused: {origin}" in result.message
    assert other_server.received == []
    assert [r["path"] for r in server.received] == ["/redirect", "/redirect"]


def test_a_3xx_without_location_is_a_failure(server, client):
    result = client.deliver(_delivery(server.url("/status/304")))
    assert not result.ok and result.status == 304


# ------------------------------------------------------------ body limit
def test_a_huge_body_is_not_read(server, client, monkeypatch):
    read = []
    original = requests.Response.iter_content

    def counting(self: requests.Response, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        for chunk in original(self, *args, **kwargs):
            read.append(len(chunk))
            yield chunk

    monkeypatch.setattr(requests.Response, "iter_content", counting)
    started = time.monotonic()
    result = client.deliver(_delivery(server.url("/huge")))
    assert time.monotonic() - started < 3
    assert result.ok and result.status == 200
    assert sum(read) <= MAX_RESPONSE_BYTES + 16 * 1024
    assert len(result.message) <= MESSAGE_LIMIT
    assert "[response body over 64 KiB, the rest not read] xxx" in result.message


# ------------------------------------------------------------ signature
def test_signature_verified_by_the_standardwebhooks_package(server, client):
    body = '{"order": 12, "note": "ção"}'
    delivery = _delivery(
        server.url("/echo"), body=body, id="chain-41", signing_secret=SIGNING_SECRET
    )
    assert client.deliver(delivery).ok
    got = server.received[0]
    headers = {k.lower(): v for k, v in got["headers"].items()}
    assert headers["webhook-id"] == "chain-41"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 10
    # the reference implementation of the spec (PyPI: standardwebhooks)
    assert Webhook(SIGNING_SECRET).verify(got["body"], headers) == json.loads(body)
    # and by hand, from the spec's text
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.{got['body']}".encode()
    expected = base64.b64encode(hmac.new(SECRET_KEY, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{expected}"
    # a tampered body does not verify
    with pytest.raises(Exception, match="signature"):
        Webhook(SIGNING_SECRET).verify(got["body"] + " ", headers)


def test_a_get_without_a_query_is_signed_over_nothing(server, client):
    delivery = _delivery(
        server.url("/echo"), method="GET", body=None, signing_secret=SIGNING_SECRET
    )
    assert client.deliver(delivery).ok
    headers = {k.lower(): v for k, v in server.received[0]["headers"].items()}
    Webhook(SIGNING_SECRET).verify("", headers, json_parse=False)


def test_sign_helper_matches_the_package():
    expected = sign(SIGNING_SECRET, "msg_1", 1_700_000_000, "{}")
    signed = Webhook(SIGNING_SECRET).sign(
        "msg_1", __import__("datetime").datetime.fromtimestamp(1_700_000_000), "{}"
    )
    assert expected.startswith("v1,") and len(expected) == len(signed)
    with pytest.raises(ConfigurationError):
        sign("whsec_!!!", "msg_1", 1, "")


def test_webhook_id_is_stable_across_deliveries_of_one_id(server, client):
    for _ in range(2):
        assert client.deliver(
            _delivery(server.url("/echo"), id="first-7", signing_secret=SIGNING_SECRET)
        ).ok
    first, second = (r["headers"] for r in server.received)
    assert first["webhook-id"] == second["webhook-id"] == "first-7"
    for got in (first, second):
        Webhook(SIGNING_SECRET).verify('{"a": 1}', {k.lower(): v for k, v in got.items()})


def test_subscription_headers_cannot_forge_the_signature_headers(server, client):
    headers = {"Webhook-Id": "forged", "webhook-signature": "v1,forged"}
    assert client.deliver(
        _delivery(server.url("/echo"), headers=headers, signing_secret=SIGNING_SECRET)
    ).ok
    got = {k.lower(): v for k, v in server.received[0]["headers"].items()}
    assert got["webhook-id"] == "d-1" and got["webhook-signature"] != "v1,forged"


def test_a_bad_signing_secret_fails_without_a_request(server, client):
    result = client.deliver(_delivery(server.url("/echo"), signing_secret="whsec_%%%not-base64"))
    assert not result.ok and "not a whsec_ secret" in result.message
    assert "%%%not-base64" not in result.message and server.received == []


# ------------------------------------------------------------ concurrency
def test_deliver_many_is_bounded_and_keeps_the_order(server):
    with WebhookClient(timeout=5, allowed_networks=LOCAL) as many:
        urls = [server.url("/sleep/0.2") for _ in range(9)]
        started = time.monotonic()
        results = many.deliver_many([_delivery(u, id=str(i)) for i, u in enumerate(urls)], 3)
        elapsed = time.monotonic() - started
    assert all(r.ok for r in results) and len(results) == 9
    assert server.max_in_flight <= 3
    assert server.max_in_flight >= 2
    assert 0.55 < elapsed < 3  # three rounds of 0.2 s
    assert [r["headers"]["webhook-id"] for r in server.received] != []
    assert sorted(r["headers"]["webhook-id"] for r in server.received) == [str(i) for i in range(9)]


def test_one_slow_endpoint_delays_nobody_else(server):
    deliveries = [_delivery(server.url("/slow"), id="slow")] + [
        _delivery(server.url(f"/status/{200 + i}"), id=str(i)) for i in range(6)
    ]
    with WebhookClient(timeout=1.0, allowed_networks=LOCAL) as many:
        started = time.monotonic()
        results = many.deliver_many(deliveries, max_concurrency=4)
        elapsed = time.monotonic() - started
    assert not results[0].ok and "timeout" in results[0].message
    assert [r.status for r in results[1:]] == [200, 201, 202, 203, 204, 205]
    fast = [r["at"] - started for r in server.received if r["path"].startswith("/status")]
    assert len(fast) == 6 and max(fast) < 0.9  # all served before the slow one's timeout
    assert elapsed < 2.5


def test_deliver_many_of_nothing_and_bad_concurrency(client):
    assert client.deliver_many([]) == []
    with pytest.raises(ConfigurationError):
        client.deliver_many([], 0)
    with pytest.raises(ConfigurationError):
        WebhookClient(max_concurrency=0)
    with pytest.raises(ConfigurationError):
        WebhookClient(timeout=0)


# ------------------------------------------------------------ SSRF
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/echo",
        "http://localhost:{port}/echo",
        "http://10.1.2.3/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:{port}/echo",
        "http://192.168.0.1/x",
        "http://0.0.0.0:{port}/echo",
        "http://[::ffff:127.0.0.1]:{port}/echo",
    ],
)
def test_block_private_networks_refuses_before_connecting(server, url):
    with WebhookClient(timeout=2, block_private_networks=True) as guarded:
        result = guarded.deliver(_delivery(url.format(port=server.port)))
    assert not result.ok and "destination refused" in result.message
    assert server.received == []


def test_block_private_networks_checks_resolved_names(server):
    resolved = {"hooks.example.com": ["93.184.216.34", "10.0.0.7"]}
    with WebhookClient(
        timeout=2, block_private_networks=True, resolve=lambda host, port: resolved[host]
    ) as guarded:
        result = guarded.deliver(_delivery("https://hooks.example.com/in"))
    assert not result.ok and "10.0.0.7, a private address" in result.message


def test_block_private_networks_false_turns_the_guard_off(server):
    with WebhookClient(timeout=2, block_private_networks=False) as unguarded:
        assert unguarded.deliver(_delivery(server.url("/status/200"))).ok


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("10.9.8.7", "private"),
        ("172.16.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-global"),
        ("::1", "loopback"),
        ("fe80::1%eth0", "link-local"),
        ("fc00::1", "private"),
        ("::ffff:10.0.0.1", "an address that embeds 10.0.0.1, a private address"),
        ("2002:7f00:1::1", "an address that embeds 127.0.0.1, a loopback address"),
        ("64:ff9b::a9fe:a9fe", "an address that embeds 169.254.169.254, a link-local address"),
        ("::7f00:1", "an address that embeds 127.0.0.1, a loopback address"),
        ("64:ff9b:1::1", "reserved"),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),  # DNS64: a public IPv4 host from an IPv6-only network
        ("2002:808:808::1", None),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
    ],
)
def test_blocked_addresses(address, reason):
    expected = reason if reason is None or " " in reason else f"a {reason} address"
    assert AddressPolicy().refusal(address) == expected


# ------------------------------------------------------------ secrets
def test_no_secret_in_any_message_or_log_line(server, client, caplog):
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Custom": TOKEN + "-2", "short": "abc"}
    outcomes = []
    for path in ("/echo", "/echo/403", "/echo/500", "/status/404"):
        delivery = _delivery(server.url(path), headers=headers, signing_secret=SIGNING_SECRET)
        outcomes.append(client.deliver(delivery))
    outcomes.append(
        client.deliver(_delivery(f"http://127.0.0.1:{_closed_port()}/", headers=headers))
    )
    outcomes.append(client.deliver(_delivery(server.url("/echo"), method="BREW", headers=headers)))
    with WebhookClient(timeout=0.3, allowed_networks=LOCAL) as slow:
        outcomes.append(slow.deliver(_delivery(server.url("/slow"), headers=headers)))
    outcomes.extend(
        client.deliver_many(
            [_delivery(server.url("/echo/401"), headers=headers, signing_secret=SIGNING_SECRET)] * 3
        )
    )
    assert [o.ok for o in outcomes][:3] == [True, False, False]
    # the echo put the token in the body: it is masked, the rest is kept
    assert "***" in outcomes[0].message and "X-Custom" in outcomes[0].message
    key_part = SIGNING_SECRET.removeprefix("whsec_")
    shown = [o.message for o in outcomes] + [caplog.text] + [repr(o) for o in outcomes]
    shown.append(repr(_delivery("http://x/", headers=headers, signing_secret=SIGNING_SECRET)))
    for text in shown:
        assert TOKEN not in text
        assert key_part not in text and SIGNING_SECRET not in text
    assert any("webhook delivery" in r.getMessage() for r in caplog.records)


def test_a_secret_in_the_url_is_redacted(server, client):
    url = f"http://user:{TOKEN}@127.0.0.1:{server.port}/status/500?api_key={TOKEN}"
    result = client.deliver(_delivery(url))
    assert not result.ok and TOKEN not in result.message


# ------------------------------------------------------------ environment
def test_webhook_timeout_from_env():
    assert webhook_timeout_from_env({}) == 20.0
    assert webhook_timeout_from_env({"DEFAULT_WEBHOOK_TIMEOUT": ""}) == 20.0
    assert webhook_timeout_from_env({"DEFAULT_WEBHOOK_TIMEOUT": "0.5"}) == 0.5
    assert webhook_timeout_from_env({"DEFAULT_WEBHOOK_TIMEOUT": "3600"}) == 3600
    for bad in ("0", "-1", "3601", "nan", "inf", "soon"):
        with pytest.raises(ConfigurationError, match="DEFAULT_WEBHOOK_TIMEOUT must be"):
            webhook_timeout_from_env({"DEFAULT_WEBHOOK_TIMEOUT": bad})


def test_block_private_networks_from_env():
    assert block_private_networks_from_env({}) is True
    assert block_private_networks_from_env({"WEBHOOK_BLOCK_PRIVATE_NETWORKS": "true"}) is True
    assert block_private_networks_from_env({"WEBHOOK_BLOCK_PRIVATE_NETWORKS": "0"}) is False
    with pytest.raises(ConfigurationError, match="WEBHOOK_BLOCK_PRIVATE_NETWORKS"):
        block_private_networks_from_env({"WEBHOOK_BLOCK_PRIVATE_NETWORKS": "maybe"})


# ------------------------------------------------------------ the guard, attacked
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}\\@8.8.8.8/echo",
        "http://127.0.0.1:{port}\\\\@8.8.8.8/echo",
        "http://8.8.8.8\\@127.0.0.1:{port}/echo",
        "http://127.0.0.1:{port}\t@8.8.8.8/echo",
    ],
)
def test_a_backslash_cannot_smuggle_a_host_past_the_guard(server, url):
    with WebhookClient(timeout=2, block_private_networks=True) as guarded:
        result = guarded.deliver(_delivery(url.format(port=server.port)))
    assert server.received == []
    assert not result.ok and result.status is None
    assert "Status Resposta: -" in result.message  # no response, no body stored


def test_a_redirect_cannot_smuggle_another_host_with_a_backslash(server, other_server):
    # urlsplit reads the target as the same origin; urllib3 would connect to
    # the other server, with the subscription's headers
    target = f"http://127.0.0.1:{other_server.port}\\@127.0.0.1:{server.port}/echo"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with WebhookClient(timeout=2, block_private_networks=False) as unguarded:
        result = unguarded.deliver(
            _delivery(server.url("/redirect?to=" + quote(target)), headers=headers)
        )
    assert other_server.received == []
    assert not result.ok and result.status == 302


def _rebind(monkeypatch: pytest.MonkeyPatch, first: str) -> None:
    """A resolver that rebinds, in this process: ``rebind.test`` answers
    ``first`` to the first lookup and 127.0.0.1 to every later one."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        return real(first if len(lookups) == 1 else "127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)


def test_dns_rebinding_cannot_reach_a_refused_address(server, monkeypatch):
    """The name answers a public address to the first lookup and 127.0.0.1
    to the next ones: the delivery connects to the address it checked."""
    _rebind(monkeypatch, "8.8.8.8")
    with WebhookClient(timeout=1, block_private_networks=True) as guarded:
        result = guarded.deliver(_delivery(f"http://rebind.test:{server.port}/echo"))
    assert server.received == []
    assert not result.ok and result.status is None


def test_the_delivery_goes_to_the_address_that_was_checked(server, monkeypatch):
    """127.0.0.2 is allowed, 127.0.0.1 is not: a name that answers 127.0.0.2
    first and 127.0.0.1 next reaches the server on 127.0.0.2 only."""
    _rebind(monkeypatch, "127.0.0.2")
    for second in _start("127.0.0.2", server.port):
        with WebhookClient(timeout=2, allowed_networks=["127.0.0.2/32"]) as guarded:
            result = guarded.deliver(_delivery(f"http://rebind.test:{server.port}/echo"))
        assert result.ok, result.message
        assert [r["headers"]["Host"] for r in second.received] == [f"rebind.test:{server.port}"]
    assert server.received == []


@pytest.mark.parametrize(
    "host",
    [
        "[::ffff:127.0.0.1]",  # IPv4-mapped
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",  # IPv4-compatible
        "[2002:7f00:1::1]",  # 6to4
        "[2002:a00:1::]",
        "[64:ff9b::127.0.0.1]",  # NAT64
        "[64:ff9b::a9fe:a9fe]",
        "[64:ff9b:1::1]",  # local-use NAT64
        "[2001:0:4136:e378:8000:63bf:80ff:fffe]",  # Teredo, client 127.0.0.1
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "100.64.0.1",
        "0.0.0.0",
    ],
)
def test_embedded_and_odd_forms_of_refused_addresses_are_refused(server, host):
    with WebhookClient(timeout=2, block_private_networks=True) as guarded:
        result = guarded.deliver(_delivery(f"http://{host}:{server.port}/echo"))
    assert not result.ok and "destination refused" in result.message, result.message
    assert server.received == []


def test_the_guard_is_on_by_default(server):
    with WebhookClient(timeout=2) as default:
        result = default.deliver(_delivery(server.url("/echo")))
    assert not result.ok and "destination refused" in result.message
    assert "a loopback address" in result.message
    assert server.received == []
    assert block_private_networks_from_env({}) is True


def test_allowed_networks_let_named_internal_targets_through(server):
    for allowed in (["127.0.0.1"], ["10.0.0.0/8", "127.0.0.0/8"], ("127.0.0.1/32",)):
        with WebhookClient(timeout=2, allowed_networks=allowed) as guarded:
            assert guarded.deliver(_delivery(server.url("/status/200"))).ok, allowed
    with WebhookClient(timeout=2, allowed_networks=["127.0.0.2/32"]) as guarded:
        refused = guarded.deliver(_delivery(server.url("/status/200")))
    assert not refused.ok and "destination refused" in refused.message
    assert len(server.received) == 3


def test_allowed_networks_from_env():
    assert allowed_networks_from_env({}) == ()
    assert allowed_networks_from_env({"WEBHOOK_ALLOWED_NETWORKS": " "}) == ()
    assert allowed_networks_from_env(
        {"WEBHOOK_ALLOWED_NETWORKS": "10.1.2.3, 192.168.0.0/16,,fd00::/8"}
    ) == (
        ipaddress.ip_network("10.1.2.3/32"),
        ipaddress.ip_network("192.168.0.0/16"),
        ipaddress.ip_network("fd00::/8"),
    )
    for bad in ("10.0.0.1/8", "intranet", "10.0.0.0/33", "127.0.0.1;10.0.0.0/8"):
        with pytest.raises(ConfigurationError, match=r"^WEBHOOK_ALLOWED_NETWORKS") as info:
            allowed_networks_from_env({"WEBHOOK_ALLOWED_NETWORKS": bad})
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigurationError, match="allowed_networks"):
        WebhookClient(allowed_networks=["nope"])


# ------------------------------------------------------------ the deadline
@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_dripping_endpoint_fails_at_the_deadline(server, part):
    with WebhookClient(timeout=1, block_private_networks=False) as unguarded:
        started = time.monotonic()
        result = unguarded.deliver(_delivery(server.url(f"/drip/{part}")))
        elapsed = time.monotonic() - started
    assert not result.ok
    assert "timeout: no complete response within 1 s" in result.message
    assert "\n" not in result.message
    # the drip would last DRIP_BYTES * DRIP_SECONDS (40 s)
    assert elapsed < DRIP_BYTES * DRIP_SECONDS / 2


# ------------------------------------------------------------ secrets in the URL
def test_a_secret_path_or_query_is_shown_nowhere(server, other_server, caplog):
    caplog.set_level(logging.DEBUG)
    query = f"code={AZURE_KEY}"
    urls = [
        server.url(f"/echo/500{SLACK_PATH}?{query}"),
        server.url(f"/echo{SLACK_PATH}?{query}"),
        server.url(f"/status/404?{query}"),
        f"http://127.0.0.1:{_closed_port()}{SLACK_PATH}?{query}",
        server.url(f"/slow{SLACK_PATH}?{query}"),
        server.url("/redirect?to=" + quote(other_server.url(f"/echo{SLACK_PATH}?{query}"))),
    ]
    with WebhookClient(timeout=0.5, block_private_networks=False) as unguarded:
        outcomes = [unguarded.deliver(_delivery(url)) for url in urls]
        outcomes.append(unguarded.deliver(_delivery(urls[0], method="GET", body='{"a": 1}')))
    with WebhookClient(timeout=0.5) as guarded:
        outcomes.append(guarded.deliver(_delivery(urls[0])))
    assert [o.ok for o in outcomes[:3]] == [False, True, False]
    shown = [o.message for o in outcomes] + [caplog.text]
    shown += [r.getMessage() for r in caplog.records]
    for text in shown:
        assert "T0SECRET1" not in text and "XyZsEcReT" not in text, text
        assert AZURE_KEY not in text, text
    assert outcomes[1].message.startswith(
        f"Webhook disparado com sucesso na URL: http://127.0.0.1:{server.port}/***. "
    )
    assert any("urllib3" in r.name for r in caplog.records)  # it did log, masked


# ------------------------------------------------------------ GET signatures
def test_a_get_is_signed_over_the_query_it_sends(server, client):
    body = json.dumps({"order": 12, "note": "x y&z"})
    delivery = _delivery(
        server.url("/echo?fixed=1"), method="GET", body=body, signing_secret=SIGNING_SECRET
    )
    assert client.deliver(delivery).ok
    got = server.received[0]
    headers = {k.lower(): v for k, v in got["headers"].items()}
    assert got["query"] == "fixed=1&order=12&note=x+y%26z"
    Webhook(SIGNING_SECRET).verify(got["query"], headers, json_parse=False)
    # a captured signature does not verify for another query (or for none)
    for other in ("fixed=1&order=13&note=x+y%26z", "order=12", ""):
        with pytest.raises(WebhookVerificationError):
            Webhook(SIGNING_SECRET).verify(other, headers, json_parse=False)


# ------------------------------------------------------------ fuzz: the URL guard
_FUZZ_NAMES = {"public.test": ["8.8.8.8"], "inside.test": ["10.0.0.7"], "both.test": ["1.1.1.1"]}


def _fuzz_resolve(host: str, port: int) -> list[str]:
    """Numeric forms as the system reads them (127.1, 0x7f.0.0.1), a few
    names from a table, and no DNS."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        if host.rstrip(".") in _FUZZ_NAMES:
            return _FUZZ_NAMES[host.rstrip(".")]
        raise
    return [str(info[4][0]) for info in infos]


def _sixtofour(address: str) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0x2002 << 112) | (int(ipaddress.IPv4Address(address)) << 80))


def _ipv4_forms() -> st.SearchStrategy[str]:
    ipv4 = st.sampled_from(
        ["127.0.0.1", "10.0.0.7", "169.254.169.254", "100.64.0.1", "0.0.0.0", "8.8.8.8"]
    ) | st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1))
    return ipv4.flatmap(
        lambda a: st.sampled_from(
            [
                a,
                f"[::ffff:{a}]",
                f"[::{a}]",
                f"[64:ff9b::{a}]",
                f"[{_sixtofour(a)}]",
                str(int(ipaddress.IPv4Address(a))),
                ".".join(hex(int(x)) for x in a.split(".")),
                a.rsplit(".", 2)[0] + "." + str(int(a.split(".")[2]) * 256 + int(a.split(".")[3])),
            ]
        )
    )


_PIECES = st.sampled_from(
    ["\\", "@", ":", "/", "?", "#", "%", "%40", "%2e", "%5c", " ", "\t", "[", "]", ".", "ü", "ß"]
)


@st.composite
def _urls(draw: st.DrawFn) -> str:
    """A host and port, or two of them around separators and an ``@``
    (``127.0.0.1:80\\@8.8.8.8``), or a user part, or pieces in any order;
    then a path and a query."""
    scheme = draw(st.sampled_from(["http", "https", "http", "https", "HTTP", "ftp"]))
    host = (
        _ipv4_forms()
        | st.sampled_from([*_FUZZ_NAMES, "localhost", "bücher.test", "[::1]", "[fe80::1%25eth0]"])
        | st.text(alphabet="abc.-:[]1%@\\ü", max_size=12)
    )
    port = st.integers(-1, 70000).map(lambda n: f":{n}") | st.just(":8x") | st.just("")
    pieces = st.lists(_PIECES, min_size=1, max_size=3).map("".join)
    userinfo = st.text(alphabet="ab:@%\\/.8", max_size=8)
    authority = draw(
        st.tuples(host, port).map("".join)
        | st.tuples(host, port, pieces, st.just("@"), host, port).map("".join)
        | st.tuples(host, port, pieces, host, port).map("".join)
        | st.tuples(userinfo, st.just("@"), host, port).map("".join)
        | st.lists(host | port | _PIECES, min_size=1, max_size=5).map("".join)
    )
    tail = draw(st.lists(_PIECES | st.text(alphabet="ab1.=&", max_size=3), max_size=6))
    return f"{scheme}://{authority}/{''.join(tail)}"


@pytest.mark.fuzz
@given(url=_urls() | st.text(max_size=40))
def test_fuzz_the_guard_checks_the_host_the_connection_uses(url: str) -> None:
    """Whatever the guard accepts, requests' connection pool (urllib3) goes
    to the host and port the guard checked, and that host's addresses are
    all outside the refused ranges."""
    client = WebhookClient(resolve=_fuzz_resolve)
    try:
        try:
            destination = parse_destination(url)
            addresses = client._check_destination(destination)
        except Refused:
            return
        prepared = requests.Request("POST", url).prepare()
        pool_key, _ = HTTPAdapter().build_connection_pool_key_attributes(prepared, True, None)
        default_port = 443 if pool_key["scheme"] == "https" else 80
        assert (pool_key["host"].lower(), pool_key["port"] or default_port) == (
            destination.host,
            destination.port,
        ), url
        assert (parse_url(url).host or "").strip("[]").lower() == destination.host, url
        assert addresses
        for address in addresses:
            assert AddressPolicy().refusal(address) is None, (url, address)
            assert address not in ("127.0.0.1", "10.0.0.7", "::1"), (url, address)
    finally:
        client.close()


def test_a_connection_to_another_host_than_the_checked_one_is_refused(server):
    """The last line of defence: inside a delivery with the guard on, a
    connection whose host is not the one the guard checked makes no socket."""
    call = Call(time.monotonic() + 5, lambda text: text)
    call.destination = Destination("http", "checked.test", server.port)
    call.addresses = ["127.0.0.1"]
    with calling(call):
        other = GuardedHTTPConnection("127.0.0.1", server.port, timeout=2)
        with pytest.raises(Refused, match="not the one that was checked"):
            other.connect()
        same = GuardedHTTPConnection("checked.test", server.port, timeout=2)
        same.connect()  # to 127.0.0.1, the checked address: no DNS lookup of the name
        same.close()
    assert call.expired is False
