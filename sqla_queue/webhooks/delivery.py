"""Webhook delivery: one HTTP call per subscription copy, with no database in sight.

The webhook worker (not wired yet) claims copies, commits, calls
:meth:`WebhookClient.deliver_many` and records the outcomes in a new
transaction: this module never opens, holds or touches a database
transaction. ``docs/webhooks.md`` is the user's page.

What one delivery does:

- ``GET``, ``POST``, ``PUT``, ``PATCH`` or ``DELETE`` (any case); any other
  method is a failure without a request.
- The body is the publication's payload text, sent as is (UTF-8), with
  ``Content-Type: application/json`` unless the subscription's headers name
  one (``text/plain; charset=utf-8`` when the text is not JSON). ``GET``
  sends no body: a JSON object payload becomes the query string.
- The subscription's headers are sent; their values never reach a message,
  an exception text or a log line (every exact occurrence in the response
  text or an error text is masked, and :func:`~sqla_queue.common.redaction.redact`
  runs on the rest). The URL is shown as scheme, host and port with its
  path and query masked (:func:`~sqla_queue.webhooks.guard.show_url`), in
  messages and in urllib3's log lines alike.
- With a signing secret (``whsec_`` + base64 key), the Standard Webhooks
  headers ``webhook-id`` (the stable delivery id), ``webhook-timestamp`` and
  ``webhook-signature``, signed over the body sent (for a ``GET``, over the
  query string sent). ``webhook-id`` is sent in any case: it is the
  receiver's idempotency key.
- 2xx is success, with the reference's message. Anything else is a failure
  whose message says why: the status and the start of the body, a timeout,
  a refused connection, a DNS or TLS error, a refused redirect.
- Redirects: at most :data:`MAX_REDIRECTS`, to the same origin (scheme,
  host, port) only; the subscription's headers would follow any other.
- At most :data:`MAX_RESPONSE_BYTES` of a response body are read.
- The timeout is also a wall-clock deadline for the whole delivery
  (connecting, the TLS handshake, sending, status line, headers and body,
  under every HTTP framing): an endpoint that drips its answer is cut off
  when it passes, and a response that ends after it is a timeout, never a
  success.
- ``block_private_networks`` (on by default) refuses loopback, private,
  link-local, multicast, unspecified, reserved and other non-global
  addresses, except ``allowed_networks``: each hop's URL is read as the
  connection reads it, its name resolved once, every address checked, and
  the connection made to those addresses (:mod:`sqla_queue.webhooks.guard`,
  :mod:`sqla_queue.webhooks.transport`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode, urljoin, urlsplit, urlunsplit

from ..common.exceptions import ConfigurationError
from ..common.redaction import MASK, redact
from ..config.ranges import Range
from ..config.settings import _flag, _number
from .guard import (
    AddressPolicy,
    Destination,
    IPNetwork,
    parse_destination,
    parse_networks,
    show_url,
)
from .guard import Refused as _Refused
from .guard import allowed_networks_from_env as allowed_networks_from_env

if TYPE_CHECKING:
    import requests

    from .transport import Call

__all__ = [
    "DEFAULT_WEBHOOK_TIMEOUT",
    "MAX_REDIRECTS",
    "MAX_RESPONSE_BYTES",
    "MESSAGE_LIMIT",
    "METHODS",
    "WEBHOOK_TIMEOUT",
    "Delivery",
    "DeliveryResult",
    "WebhookClient",
    "allowed_networks_from_env",
    "block_private_networks_from_env",
    "sign",
    "webhook_timeout_from_env",
]

logger = logging.getLogger(__name__)

#: seconds; the seed's default for ``DEFAULT_WEBHOOK_TIMEOUT``
DEFAULT_WEBHOOK_TIMEOUT = 20.0
#: the values ``DEFAULT_WEBHOOK_TIMEOUT`` accepts
WEBHOOK_TIMEOUT = Range(0, 3600, low_open=True, unit="seconds")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MAX_REDIRECTS = 5
#: bytes of a response body read at most (the rest is never downloaded)
MAX_RESPONSE_BYTES = 64 * 1024
#: the length of ``mensagem`` (the reference cut its message to 500)
MESSAGE_LIMIT = 500
_REDIRECTS = (301, 302, 303, 307, 308)
# RFC 9110 token characters, for header names
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def webhook_timeout_from_env(env: Mapping[str, str] | None = None) -> float:
    """``DEFAULT_WEBHOOK_TIMEOUT`` in seconds (default 20): more than 0 and at
    most 3600, else a ConfigurationError naming the variable."""
    env = os.environ if env is None else env
    return _number(env, "DEFAULT_WEBHOOK_TIMEOUT", DEFAULT_WEBHOOK_TIMEOUT, WEBHOOK_TIMEOUT)


def block_private_networks_from_env(env: Mapping[str, str] | None = None) -> bool:
    """``WEBHOOK_BLOCK_PRIVATE_NETWORKS`` (true/false, default true)."""
    env = os.environ if env is None else env
    return _flag(env, "WEBHOOK_BLOCK_PRIVATE_NETWORKS", default=True)


@dataclass(frozen=True)
class Delivery:
    """One call to make: a subscription's destination and a publication's payload."""

    url: str
    http_method: str
    #: the publication's payload text (None or "" sends no body)
    body: str | None
    #: stable across the retries of one delivery (the copy chain's first id):
    #: sent as ``webhook-id``, the receiver's idempotency key
    delivery_id: str
    #: the subscription's headers (values may be tokens: never shown)
    headers: Mapping[str, Any] | None = field(default=None, repr=False)
    #: ``whsec_`` + base64 key: signs the delivery (Standard Webhooks)
    signing_secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class DeliveryResult:
    """The outcome of one delivery; ``message`` fits ``mensagem`` and holds no secret."""

    ok: bool
    #: the last response's status, None when there was no response
    status: int | None
    message: str


class _Late(_Refused):
    """The delivery's deadline passed; the text says what had come by then."""


def _secret_key(secret: str) -> bytes:
    raw = secret[len("whsec_") :] if secret.startswith("whsec_") else secret
    try:
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        raise _Refused("the signing secret is not a whsec_ secret (base64 after whsec_)")
    return key


def sign(secret: str, delivery_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` value: ``v1,`` + base64 of the HMAC-SHA256,
    keyed by the secret's key, of ``{id}.{timestamp}.{body}``."""
    try:
        key = _secret_key(secret)
    except _Refused as exc:
        raise ConfigurationError(str(exc)) from None
    return _signature(key, delivery_id, timestamp, body)


def _signature(key: bytes, delivery_id: str, timestamp: int, body: str) -> str:
    digest = hmac.new(key, f"{delivery_id}.{timestamp}.{body}".encode(), hashlib.sha256)
    return "v1," + base64.b64encode(digest.digest()).decode("ascii")


def _default_resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _query_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class WebhookClient:
    """Delivers webhooks through one pooled ``requests.Session`` (one client
    per worker lane; :meth:`close` it, or use it as a context manager).

    ``timeout`` is in seconds (``webhook_timeout_from_env()``): the limit for
    connecting, for each wait on the server, and a wall-clock deadline for
    the whole delivery (redirects and body included).
    ``block_private_networks`` (default on) refuses every non-global
    destination except ``allowed_networks`` (addresses and CIDR ranges).
    ``max_concurrency`` is :meth:`deliver_many`'s default and sizes the
    connection pool. ``resolve`` (host, port -> addresses) is for tests."""

    def __init__(
        self,
        timeout: float = DEFAULT_WEBHOOK_TIMEOUT,
        *,
        block_private_networks: bool = True,
        allowed_networks: Iterable[str | IPNetwork] = (),
        max_concurrency: int = 8,
        resolve: Callable[[str, int], Sequence[str]] | None = None,
    ) -> None:
        self.timeout = WEBHOOK_TIMEOUT.check("timeout", timeout)
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise ConfigurationError(
                f"max_concurrency must be a whole number, not {max_concurrency!r}"
            )
        if max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be at least 1, not {max_concurrency!r}")
        self.block_private_networks = block_private_networks
        self.policy = AddressPolicy(
            block_private_networks, parse_networks(allowed_networks, "allowed_networks")
        )
        self.max_concurrency = max_concurrency
        self._resolve = resolve or _default_resolve
        # requests (6 MiB) and the cookie jar (1 MiB) only where webhooks are
        # delivered, not in every worker
        import http.cookiejar

        import requests

        from .transport import PinnedAdapter

        self.session = requests.Session()
        # No cookie is kept: a Set-Cookie from one subscriber's endpoint must
        # not ride along another subscription's delivery to the same host.
        self.session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        adapter = PinnedAdapter(pool_connections=16, pool_maxsize=max(10, max_concurrency))
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> WebhookClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ batches
    def deliver_many(
        self, deliveries: Iterable[Delivery], max_concurrency: int | None = None
    ) -> list[DeliveryResult]:
        """:meth:`deliver` each one, at most ``max_concurrency`` at a time;
        the results in the order of ``deliveries``."""
        items = list(deliveries)
        limit = self.max_concurrency if max_concurrency is None else max_concurrency
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"max_concurrency must be a whole number >= 1, not {limit!r}")
        if not items:
            return []
        if limit == 1 or len(items) == 1:
            return [self.deliver(item) for item in items]
        with ThreadPoolExecutor(
            max_workers=min(limit, len(items)), thread_name_prefix="sqla-queue-webhook"
        ) as pool:
            return list(pool.map(self.deliver, items))

    # ------------------------------------------------------------ one call
    def deliver(self, delivery: Delivery) -> DeliveryResult:
        """Make one delivery. Never raises for what the network or the
        endpoint does: every outcome is a :class:`DeliveryResult`."""
        import requests

        from .transport import Call, calling

        secrets = _secrets_of(delivery)
        _hide(secrets, _url_texts(delivery.url))
        method = str(delivery.http_method or "").strip().upper()
        shown_url = show_url(delivery.url)
        call = Call(time.monotonic() + self.timeout, lambda text: _scrub(text, secrets))
        try:
            with calling(call):
                result = self._deliver(delivery, method, secrets, call)
        except Exception as exc:
            status = exc.status if isinstance(exc, _Refused) else None
            if isinstance(exc, _Late):
                text = str(exc)
            elif call.expired or time.monotonic() >= call.deadline:
                # whatever broke, the deadline had passed: the watchdog's
                # shutdown reads as a closed or cut connection
                text = _timeout_text(self.timeout)
            elif isinstance(exc, _Refused):
                text = str(exc)
            elif isinstance(exc, requests.RequestException):
                text = _describe(exc, self.timeout)
            else:  # a bug of ours or of a library: still an outcome
                text = f"unexpected error: {type(exc).__name__}: {exc}"
            result = self._failure(shown_url, method, status, text, secrets)
        logger.debug("webhook delivery %s: %s", "ok" if result.ok else "failed", result.message)
        return result

    def _failure(
        self, url: str, method: str, status: int | None, text: str, secrets: list[str]
    ) -> DeliveryResult:
        prefix = (
            f"Webhook falhou na URL: {url}. Método HTTP: {method or '?'}. "
            f"Status Resposta: {status if status is not None else '-'}. Mensagem: "
        )
        return DeliveryResult(False, status, _compose(prefix, _scrub(text, secrets)))

    def _deliver(
        self, delivery: Delivery, method: str, secrets: list[str], call: Call
    ) -> DeliveryResult:
        import requests
        from requests.utils import select_proxy

        if method not in METHODS:
            raise _Refused(
                f"unsupported HTTP method {method!r}: use one of {', '.join(METHODS)}"[:200]
            )
        if not isinstance(delivery.delivery_id, str) or not delivery.delivery_id.strip():
            raise _Refused("the delivery id is empty")
        if any(c in delivery.delivery_id for c in "\r\n\0"):
            raise _Refused("the delivery id holds a line break")
        headers = _headers(delivery.headers)
        url = delivery.url
        start = destination = parse_destination(url)
        body = delivery.body or ""
        if method == "GET":
            url = _with_query(url, body)
            body = ""
        elif body and not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = (
                "application/json" if _is_json(body) else "text/plain; charset=utf-8"
            )
        key = _secret_key(delivery.signing_secret) if delivery.signing_secret else None
        headers = {n: v for n, v in headers.items() if n.lower() not in _SIGNATURE_HEADERS}
        headers["webhook-id"] = delivery.delivery_id

        hops = 0
        while True:
            prepared = self.session.prepare_request(
                requests.Request(
                    method, url, data=body.encode("utf-8") if body else None, headers=headers
                )
            )
            assert prepared.url is not None
            _hide(secrets, _url_texts(url) + _url_texts(prepared.url) + [prepared.path_url])
            if key is not None:
                # what is sent is signed: the body, or a GET's query string
                signed = prepared.path_url.partition("?")[2] if method == "GET" else body
                timestamp = int(time.time())
                prepared.headers["webhook-timestamp"] = str(timestamp)
                prepared.headers["webhook-signature"] = _signature(
                    key, delivery.delivery_id, timestamp, signed
                )
            settings = self.session.merge_environment_settings(prepared.url, {}, True, None, None)
            proxied = bool(select_proxy(prepared.url, settings["proxies"]))
            addresses = self._check_destination(destination) if self.policy.block else None
            # through a proxy, the proxy connects (and resolves the name)
            call.destination = destination
            call.addresses = None if proxied else addresses
            remaining = call.deadline - time.monotonic()
            if remaining <= 0:
                raise _Late(_timeout_text(self.timeout))
            response = self.session.send(
                prepared, timeout=remaining, allow_redirects=False, **settings
            )
            try:
                status = response.status_code
                location = response.headers.get("Location")
                if status in _REDIRECTS and location:
                    if not call.in_time():
                        raise _Late(_timeout_text(self.timeout), status)
                    target = urljoin(url, location)
                    _hide(secrets, _url_texts(target))
                    try:
                        destination = parse_destination(target)
                    except _Refused as exc:
                        raise _Refused(f"redirect refused: {exc}", status) from None
                    if destination != start:
                        raise _Refused(
                            "redirect to another origin refused: " + destination.show(), status
                        )
                    hops += 1
                    if hops > MAX_REDIRECTS:
                        raise _Refused(f"too many redirects (more than {MAX_REDIRECTS})", status)
                    # what browsers and requests do: 303, and 301/302 after a
                    # POST, become a GET without a body
                    if (status == 303 and method != "HEAD") or (
                        status in (301, 302) and method == "POST"
                    ):
                        method, body = "GET", ""
                        headers = {n: v for n, v in headers.items() if n.lower() != "content-type"}
                    url = target
                    continue
                try:
                    text, cut = _read_text(response, call.deadline, self.timeout)
                except requests.RequestException as exc:
                    if call.expired or time.monotonic() >= call.deadline:
                        raise _Late(_timeout_text(self.timeout, _BODY), status) from None
                    raise _Refused(_describe(exc, self.timeout), status) from None
                # the watchdog's shutdown reads as the end of a body read to
                # the end of the stream: a body that ended late is cut
                if not call.in_time():
                    raise _Late(_timeout_text(self.timeout, _BODY), status)
            finally:
                response.close()
            if cut:
                limit = MAX_RESPONSE_BYTES // 1024
                text = f"[response body over {limit} KiB, the rest not read] {text}"
            shown_url = show_url(delivery.url)
            if 200 <= status < 300:
                prefix = (
                    f"Webhook disparado com sucesso na URL: {shown_url}. Método HTTP: {method}. "
                    f"Status Resposta: {status}. Mensagem: "
                )
                return DeliveryResult(True, status, _compose(prefix, _scrub(text, secrets)))
            return self._failure(shown_url, method, status, text, secrets)

    def _check_destination(self, destination: Destination) -> list[str]:
        """The destination's addresses, each one allowed by the policy."""
        host = destination.host
        try:
            found = [host] if _is_ip(host) else list(self._resolve(host, destination.port))
        except (OSError, UnicodeError):
            raise _Refused(f"DNS failure: cannot resolve {host}") from None
        addresses = list(dict.fromkeys(found))
        if not addresses:
            raise _Refused(f"DNS failure: no address for {host}")
        for address in addresses:
            reason = self.policy.refusal(address)
            if reason is not None:
                raise _Refused(
                    f"destination refused: {host} is {address}, {reason} "
                    "(WEBHOOK_BLOCK_PRIVATE_NETWORKS, WEBHOOK_ALLOWED_NETWORKS)"
                )
        return addresses


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _secs(value: float) -> str:
    return f"{value:g} s"


#: where a timeout caught a response whose status and headers had come
_BODY = "status and headers received, the body incomplete"


def _timeout_text(timeout: float, stage: str | None = None) -> str:
    text = f"timeout: no complete response within {_secs(timeout)}"
    return f"{text} ({stage})" if stage else text


def _headers(raw: Mapping[str, Any] | None) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _Refused("the subscription's headers are not a JSON object")
    headers: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise _Refused(f"invalid header name {str(name)[:60]!r}")
        if value is None:
            continue
        text = value if isinstance(value, str) else _query_value(value)
        if any(c in text for c in "\r\n\0"):
            # the value is never shown: it may be the token
            raise _Refused(f"the value of header {name} holds a line break")
        try:
            text.encode("latin-1")  # what HTTP/1.1 header values are made of
        except UnicodeEncodeError:
            raise _Refused(
                f"the value of header {name} holds a character outside Latin-1"
            ) from None
        headers[name] = text
    return headers


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _with_query(url: str, body: str) -> str:
    if not body.strip():
        return url
    try:
        value = json.loads(body)
    except ValueError:
        raise _Refused(
            "a GET needs a JSON object payload (for the query string); this one is not JSON"
        ) from None
    if not isinstance(value, dict):
        raise _Refused(
            "a GET needs a JSON object payload (for the query string), not a JSON "
            + type(value).__name__.replace("dict", "object").replace("list", "array")
        )
    pairs: list[tuple[str, str]] = []
    for name, item in value.items():
        if isinstance(item, list):
            pairs.extend((name, _query_value(element)) for element in item)
        else:
            pairs.append((name, _query_value(item)))
    parts = urlsplit(url)
    query = urlencode(pairs)
    if parts.query:
        query = f"{parts.query}&{query}" if query else parts.query
    return urlunsplit(parts._replace(query=query))


def _read_text(response: requests.Response, deadline: float, timeout: float) -> tuple[str, bool]:
    """At most MAX_RESPONSE_BYTES of the body, decoded; and whether there was
    more. The deadline is checked between reads (the watchdog ends a read
    blocked past it)."""
    data = bytearray()
    cut = False
    for chunk in response.iter_content(chunk_size=16 * 1024):
        if time.monotonic() >= deadline:
            raise _Late(_timeout_text(timeout, _BODY), response.status_code)
        data += chunk
        if len(data) > MAX_RESPONSE_BYTES:
            del data[MAX_RESPONSE_BYTES:]
            cut = True
            break
    encoding = response.encoding or "utf-8"
    try:
        text = bytes(data).decode(encoding, errors="replace")
    except LookupError:
        text = bytes(data).decode("utf-8", errors="replace")
    return text.strip(), cut


def _describe(exc: requests.RequestException, timeout: float) -> str:
    """What went wrong, in a line: the kind first, then the library's text
    (which quotes the URL, never the headers; scrubbed by the caller)."""
    import requests

    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, requests.ConnectTimeout):
        return f"timeout: could not connect within {_secs(timeout)} ({detail})"
    if isinstance(exc, requests.Timeout):
        return f"timeout: no response within {_secs(timeout)} ({detail})"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS error ({detail})"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return f"incomplete or malformed response body ({detail})"
    if isinstance(exc, requests.ConnectionError):
        text = str(exc)
        if "NameResolutionError" in text or "Name or service not known" in text:
            return f"DNS failure ({detail})"
        if "Connection refused" in text or "ConnectionRefusedError" in text:
            return f"connection refused ({detail})"
        return f"connection error ({detail})"
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema)):
        return f"invalid URL ({detail})"
    return detail


def _secrets_of(delivery: Delivery) -> list[str]:
    """Every text to mask in what is shown: the header values (and the
    credential after ``Bearer`` / ``Basic``), the signing secret and its key
    part. Only those longer than 3 characters: masking "1" or "yes" would
    hide half of any message and protect nothing."""
    found: set[str] = set()
    raw = delivery.headers if isinstance(delivery.headers, Mapping) else {}
    for value in raw.values():
        if value is None:
            continue
        text = value if isinstance(value, str) else _query_value(value)
        found.add(text)
        found.add(text.strip())
        _, _, credential = text.strip().partition(" ")
        if credential:
            found.add(credential.strip())
    secret = delivery.signing_secret
    if isinstance(secret, str):
        found.add(secret)
        if secret.startswith("whsec_"):
            found.add(secret[len("whsec_") :])
    return sorted((s for s in found if len(s) > 3), key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return redact(text)


def _url_texts(url: object) -> list[str]:
    """The parts of a URL that may hold a secret (path, query, user part),
    as written and percent-decoded, for :func:`_scrub` to mask."""
    if not isinstance(url, str):
        return []
    try:
        split = urlsplit(url)
    except ValueError:
        return [url]
    texts = [url, split.path, split.query, split.fragment, split.netloc.rpartition("@")[0]]
    if split.query:
        texts.append(f"{split.path}?{split.query}")
    texts += [unquote(text) for text in texts]
    return [text for text in texts if len(text) > 1]


def _hide(secrets: list[str], texts: Iterable[str]) -> None:
    """Add ``texts`` to ``secrets`` (longest first, as :func:`_scrub` needs)."""
    secrets.extend(text for text in texts if text not in secrets)
    secrets.sort(key=len, reverse=True)


def _compose(prefix: str, text: str, end: str = ".") -> str:
    """``prefix + text + end`` in MESSAGE_LIMIT characters: ``text`` is cut
    (with an ellipsis) first; a prefix that alone is too long is cut too."""
    room = MESSAGE_LIMIT - len(prefix) - len(end)
    if len(text) > room:
        text = text[: max(0, room - 1)] + "…"
    return (prefix + text + end)[:MESSAGE_LIMIT]
