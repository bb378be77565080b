"""Where a webhook may go: its URL read once, the way the connection reads
it, and the address policy that judges where it would connect.

A subscriber row is untrusted input: whoever can write one chooses the URL
the worker calls, and reads the answer back in ``mensagem``. So:

- :func:`parse_destination` reads the URL with ``urllib.parse`` and with
  urllib3's parser (what ``requests`` connects with) and refuses a URL the
  two read differently (host, port or user part), or whose authority holds
  a backslash, a space, a control character or a percent sign. The host it
  returns (lowercase, IDNA, no brackets) is the one the connection uses.
- :class:`AddressPolicy` refuses loopback, private, link-local, multicast,
  unspecified, reserved and every other non-global address (CGNAT
  ``100.64.0.0/10`` included), and judges an IPv6 address that embeds an
  IPv4 one (IPv4-mapped, IPv4-compatible, 6to4, NAT64, Teredo) by the IPv4
  address it embeds (a DNS64 network's ``64:ff9b::8.8.8.8`` is public).
  ``WEBHOOK_ALLOWED_NETWORKS`` names addresses and ranges it lets through;
  ``WEBHOOK_BLOCK_PRIVATE_NETWORKS=false`` turns it off.
- :func:`show_url` is how a subscription URL is shown anywhere (rows, logs,
  errors): scheme, host and port, with the path and query masked, because
  Slack-style paths and Azure-style ``?code=`` keys are credentials.

The delivery (:mod:`sqla_queue.webhooks.delivery`) connects only to the addresses
this module checked (:mod:`sqla_queue.webhooks.transport`).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..common.exceptions import ConfigurationError
from ..common.redaction import MASK

__all__ = [
    "AddressPolicy",
    "Destination",
    "Refused",
    "allowed_networks_from_env",
    "parse_destination",
    "parse_networks",
    "show_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
#: non-global ranges Python 3.11's ``is_global`` does not know yet
_NOT_GLOBAL = (ipaddress.IPv6Network("64:ff9b:1::/48"),)
_KINDS = ("loopback", "link_local", "multicast", "unspecified", "reserved", "private")


class Refused(Exception):
    """A delivery refused before or between requests; the text is safe to show."""

    def __init__(self, text: str, status: int | None = None) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True)
class Destination:
    """Where a URL connects: its scheme, host (as the connection spells it:
    lowercase, IDNA, without brackets) and port (the scheme's when none)."""

    scheme: str
    host: str
    port: int

    def show(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = DEFAULT_PORTS[self.scheme] == self.port
        return f"{self.scheme}://{host}" + ("" if default else f":{self.port}")


def parse_destination(url: object) -> Destination:
    """The destination of ``url``, or :class:`Refused` (its text says why)."""
    from urllib3.exceptions import LocationParseError
    from urllib3.util import parse_url

    if not isinstance(url, str):
        raise Refused("the URL must start with http:// or https://")
    if _CONTROL.search(url):
        raise Refused("the URL holds a control character")
    try:
        split = urlsplit(url)
    except ValueError:
        raise Refused("the URL cannot be parsed") from None
    scheme = split.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise Refused("the URL must start with http:// or https://")
    authority = split.netloc
    if "\\" in authority or any(c.isspace() for c in authority):
        raise Refused("the URL's host part holds a backslash or a space")
    if "%" in authority.rpartition("@")[2]:
        raise Refused("the URL's host holds a percent sign (percent-encoding or an IPv6 zone)")
    try:
        port = split.port
    except ValueError:
        raise Refused("the URL's port is not a number from 0 to 65535") from None
    if not split.hostname:
        raise Refused("the URL has no host")
    try:
        parsed = parse_url(url)
    except LocationParseError:
        raise Refused("the URL cannot be parsed") from None
    host = _ascii_host(split.hostname)
    userinfo = authority.rpartition("@")[0] if "@" in authority else None
    theirs = ((parsed.host or "").strip("[]").lower(), parsed.port, parsed.auth)
    if (host, port, userinfo) != theirs:
        raise Refused(
            "the URL is ambiguous: URL parsers read its host, port or user part differently"
        )
    return Destination(scheme, host, port or DEFAULT_PORTS[scheme])


def _ascii_host(host: str) -> str:
    """The host as ``requests`` sends it: IDNA (UTS 46) for a non-ASCII name."""
    if host.isascii():
        return host.lower()
    import idna  # a dependency of requests

    try:
        return idna.encode(host, uts46=True).decode("ascii").lower()
    except idna.IDNAError:
        raise Refused("the URL's host is not a valid domain name") from None


def show_url(url: object) -> str:
    """``url`` as it may be shown: scheme, host and port; the path and the
    query (which may hold keys) as ``***``; never the user part."""
    text = url if isinstance(url, str) else ""
    try:
        split = urlsplit(text)
        port = split.port
    except ValueError:
        return MASK
    scheme = split.scheme.lower()
    host = split.hostname or ""
    if scheme not in DEFAULT_PORTS or not host or _CONTROL.search(text) or "\\" in split.netloc:
        return MASK
    shown = Destination(scheme, host, port or DEFAULT_PORTS[scheme]).show()
    if split.path not in ("", "/") or split.query or split.fragment:
        shown += "/" + MASK
    return shown


def parse_networks(text: str | Iterable[str | IPNetwork], name: str) -> tuple[IPNetwork, ...]:
    """Addresses and CIDR ranges, comma-separated (or an iterable); a bad
    one is a ConfigurationError naming ``name``. An address is a one-address
    range; a range with host bits set (``10.0.0.1/8``) is refused as a typo."""
    items = text.split(",") if isinstance(text, str) else list(text)
    networks: list[IPNetwork] = []
    for item in items:
        if isinstance(item, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            networks.append(item)
            continue
        if not isinstance(item, str):
            raise ConfigurationError(f"{name}: {item!r} is not an IP address or CIDR range")
        if not item.strip():
            continue
        try:
            networks.append(ipaddress.ip_network(item.strip()))
        except ValueError as exc:
            raise ConfigurationError(
                f"{name}: {item.strip()!r} is not an IP address or CIDR range ({exc})"
            ) from None
    return tuple(networks)


def allowed_networks_from_env(env: Mapping[str, str] | None = None) -> tuple[IPNetwork, ...]:
    """``WEBHOOK_ALLOWED_NETWORKS``: comma-separated addresses and CIDR
    ranges the guard lets through (default none)."""
    env = os.environ if env is None else env
    return parse_networks(env.get("WEBHOOK_ALLOWED_NETWORKS") or "", "WEBHOOK_ALLOWED_NETWORKS")


def embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, 6to4,
    NAT64, Teredo server and client)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def address_kind(ip: IPAddress) -> str | None:
    """Why ``ip`` itself is refused (``loopback``, ``private``…), or None."""
    for kind in _KINDS:
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global or any(ip in network for network in _NOT_GLOBAL):
        return "non-global"
    return None


class AddressPolicy:
    """Which addresses a webhook may connect to. ``block``: refuse every
    non-global address (and those that embed one) except ``allowed``."""

    def __init__(self, block: bool = True, allowed: Iterable[IPNetwork] = ()) -> None:
        self.block = block
        self.allowed = tuple(allowed)

    def refusal(self, address: str) -> str | None:
        """Why ``address`` is refused (``a loopback address``…), or None."""
        if not self.block:
            return None
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        embedded = embedded_ipv4(ip)
        if any(
            candidate.version == network.version and candidate in network
            for candidate in (ip, *embedded)
            for network in self.allowed
        ):
            return None
        # a translated form (IPv4-mapped, NAT64, 6to4...) reaches the IPv4
        # address it carries: that address is what is judged
        for inner in embedded:
            kind = address_kind(inner)
            if kind is not None:
                return f"an address that embeds {inner}, a {kind} address"
        if embedded:
            return None
        kind = address_kind(ip)
        return None if kind is None else f"a {kind} address"
