"""Strangers: the connections that have not authenticated yet.

Anyone who can reach the ports can open connections, and a connection is a
stranger until it answers the challenge: through its TLS handshake, the
challenge and its answer. Strangers must never keep a worker out, exhaust
the process's file descriptors or flood the log, so they live apart from
the authenticated clients (whom ``MAX_CLIENT_THREADS`` bounds):

- :class:`Admission` holds at most ``max_total`` strangers, and at most
  ``max_per_address`` from one address (an IPv6 /64 counts as one address:
  a host gets a whole /64). A stranger is counted from its accept, before
  the TLS handshake. Over either cap, the server does not refuse the
  newcomer: it drops the *oldest* stranger of the address that holds the
  most. So a flood from some addresses only ever drops its own
  connections, never the handshakes of the others; and a worker that shares
  the flood's address still gets in if it authenticates before
  ``max_per_address`` newer connections arrive from there. The server gives
  each stranger ``SQLA_QUEUE_SERVER_AUTH_TIMEOUT`` seconds in all.
- :class:`RefusalLog` logs the strangers refused or dropped: the first of a
  quiet spell at once (its address and the reason), then the count by
  reason in one summary line per interval for as long as they go on.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["PER_ADDRESS", "TOTAL", "Admission", "RefusalLog", "address_key"]

#: seconds between two summary lines of refused strangers
REFUSAL_LOG_INTERVAL_SECONDS = 10.0
#: why a stranger was dropped to make room
PER_ADDRESS = (
    "too many unauthenticated connections from its address "
    "(SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED_PER_ADDRESS)"
)
TOTAL = "too many unauthenticated connections (SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED)"

_T = TypeVar("_T", bound=Hashable)


def address_key(host: str) -> str:
    """The "address" a per-address cap counts by: the IPv4 address, or
    the /64 of an IPv6 one (the IPv4 address inside an IPv4-mapped one)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # a Unix socket path or the like: one address
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class Admission(Generic[_T]):
    """Who is waiting to authenticate, by address, oldest first.

    Pure bookkeeping: :meth:`admit` says whom to drop, the caller drops them."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        #: address -> its strangers, oldest first (a dict keeps insertion order)
        self._by_address: dict[str, dict[_T, None]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def admit(self, address: str, stranger: _T) -> list[tuple[_T, str]]:
        """Count ``stranger`` in; the strangers to drop to stay within the
        caps (never a newcomer while an older one of its address is there),
        each with the reason, already counted out."""
        waiting = self._by_address.setdefault(address, {})
        waiting[stranger] = None
        self._count += 1
        dropped: list[tuple[_T, str]] = []
        if len(waiting) > self.max_per_address:
            dropped.append((self._pop_oldest(address), PER_ADDRESS))
        while self._count > self.max_total:
            heaviest = max(self._by_address, key=lambda key: len(self._by_address[key]))
            dropped.append((self._pop_oldest(heaviest), TOTAL))
        return dropped

    def leave(self, address: str, stranger: _T) -> bool:
        """Count ``stranger`` out (authenticated, or gone); whether it was in."""
        waiting = self._by_address.get(address)
        if waiting is None or stranger not in waiting:
            return False
        del waiting[stranger]
        self._count -= 1
        if not waiting:
            del self._by_address[address]
        return True

    def _pop_oldest(self, address: str) -> _T:
        oldest = next(iter(self._by_address[address]))
        self.leave(address, oldest)
        return oldest


class RefusalLog:
    """Refused strangers, logged without flooding the log.

    The first refusal after a quiet interval is logged at once with its
    address and reason; the next ones are counted, and :meth:`flush` (which
    :meth:`note` calls too) writes one line per interval with the counts by
    reason. So a flood of any size costs about one line per interval."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_seconds: float = REFUSAL_LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_seconds = interval_seconds
        self.clock = clock
        self._since: float | None = None  # the start of the current interval
        self._counts: Counter[str] = Counter()

    def note(self, peer: str, reason: str, *, kind: str | None = None) -> None:
        """A refusal of ``peer`` for ``reason``; counted under ``kind`` (by
        default the reason: give a bounded set of kinds, the summary line
        lists them all)."""
        self.flush()
        if self._since is None:
            self._since = self.clock()
            self.logger.warning(
                "refused %s: %s (further refusals: one line every %g s)",
                peer,
                reason,
                self.interval_seconds,
            )
        else:
            self._counts[kind or reason] += 1

    def flush(self, *, force: bool = False) -> None:
        """At the end of an interval (or when ``force``-d), one line with
        the refusals counted in it; the next refusal after a quiet interval
        is logged at once again."""
        if self._since is None:
            return
        elapsed = self.clock() - self._since
        if elapsed < self.interval_seconds and not force:
            return
        if not self._counts:
            self._since = None  # a quiet interval
            return
        reasons = ", ".join(f"{count} {reason}" for reason, count in self._counts.most_common())
        self.logger.warning(
            "refused %d more connection(s) that did not authenticate in the last %.0f s: %s",
            sum(self._counts.values()),
            elapsed,
            reasons,
        )
        self._counts.clear()
        self._since = self.clock()
