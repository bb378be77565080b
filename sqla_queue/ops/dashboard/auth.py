"""The dashboard's logins: sessions kept on the server, and login throttling.

Sessions live in the memory of the dashboard process (:class:`SessionStore`).
The cookie holds nothing but a random 256-bit session id; the store keeps the
user, the CSRF token, when the session was created and last seen, and when it
expires. Logging out deletes the session, so the cookie, replayed, is refused.
Another process (a restart, a second dashboard sharing
``SQLA_QUEUE_DASHBOARD_SECRET``, a dashboard started with a new password) and
another app built in the same process have stores of their own: none accepts
a cookie the first one issued. Nothing is signed, so the secret is no longer
needed.

A visitor who has not logged in gets an anonymous session when the login form
is shown: it carries the form's CSRF token only, for 30 minutes. Both kinds
are capped (the oldest goes first), so a flood of login forms cannot fill the
memory, nor push out a logged-in operator.

:class:`LoginThrottle` counts failed logins per client address and over all
clients. A client's first five failures are free; each further one locks that
client out for twice as long as the one before (1 s, 2 s, 4 s... at most 15
minutes). Over all clients, at most 30 failures a minute are checked. A login
tried during a lockout is refused without checking the password (and counts
as nothing), so every lockout ends: the operator's correct password works
once it has. A client without a failure for an hour starts afresh, and a
correct login clears its count. Both classes take the clock (seconds, as
``time.monotonic``) so tests move time instead of sleeping.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DashboardSession", "LoginThrottle", "LoginVerdict", "SessionStore"]

Clock = Callable[[], float]

SESSION_SECONDS = 8 * 3600.0
ANONYMOUS_SECONDS = 30 * 60.0
#: sessions of each kind (logged in, anonymous) kept at most
MAX_SESSIONS = 1000
FREE_FAILURES = 5
FIRST_LOCKOUT_SECONDS = 1.0
MAX_LOCKOUT_SECONDS = 15 * 60.0
FORGET_AFTER_SECONDS = 3600.0
GLOBAL_FAILURES_PER_MINUTE = 30
#: client addresses whose failures are remembered at most (the oldest go first)
MAX_CLIENTS = 10_000


@dataclass
class DashboardSession:
    """One browser's session: ``user`` is None until it logs in."""

    id: str
    user: str | None
    csrf: str
    created: float
    last_seen: float
    expires: float


class SessionStore:
    """The sessions of one dashboard app, in memory (thread-safe)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, DashboardSession] = {}

    def get(self, session_id: str | None) -> DashboardSession | None:
        """The live session with this id (its last-seen time updated), else None."""
        if not session_id:
            return None
        now = self._clock()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if now >= session.expires:
                del self._sessions[session_id]
                return None
            session.last_seen = now
            return session

    def start(self, user: str | None) -> DashboardSession:
        """A new session (a new id and CSRF token): anonymous when ``user`` is None."""
        now = self._clock()
        lifetime = ANONYMOUS_SECONDS if user is None else SESSION_SECONDS
        session = DashboardSession(
            id=secrets.token_urlsafe(32),
            user=user,
            csrf=secrets.token_urlsafe(32),
            created=now,
            last_seen=now,
            expires=now + lifetime,
        )
        with self._lock:
            self._prune(now, anonymous=user is None)
            self._sessions[session.id] = session
        return session

    def end(self, session_id: str | None) -> None:
        """Forget the session (a logout, or the anonymous one at login)."""
        if session_id:
            with self._lock:
                self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _prune(self, now: float, *, anonymous: bool) -> None:
        for key in [k for k, s in self._sessions.items() if now >= s.expires]:
            del self._sessions[key]
        same = [s for s in self._sessions.values() if (s.user is None) == anonymous]
        if len(same) >= MAX_SESSIONS:
            oldest = sorted(same, key=lambda s: s.created)[: len(same) - MAX_SESSIONS + 1]
            for session in oldest:
                del self._sessions[session.id]


@dataclass(frozen=True)
class LoginVerdict:
    """``ok``: let in. Otherwise ``retry_after_seconds`` > 0 means the try
    was refused unchecked (throttled); 0 means a wrong user or password."""

    ok: bool
    retry_after_seconds: float = 0.0

    @property
    def throttled(self) -> bool:
        return self.retry_after_seconds > 0


@dataclass
class _Failures:
    count: int
    last: float
    locked_until: float


class LoginThrottle:
    """Failed logins per client address and over all clients (thread-safe)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, _Failures] = {}
        self._recent: deque[float] = deque()

    def attempt(self, client: str, correct: bool) -> LoginVerdict:
        """The verdict on a login from ``client`` whose credential was
        ``correct`` (checked by the caller, in constant time)."""
        now = self._clock()
        with self._lock:
            while self._recent and now - self._recent[0] >= 60.0:
                self._recent.popleft()
            wait = 0.0
            if len(self._recent) >= GLOBAL_FAILURES_PER_MINUTE:
                wait = self._recent[0] + 60.0 - now
            failures = self._clients.get(client)
            if failures is not None and now - failures.last >= FORGET_AFTER_SECONDS:
                del self._clients[client]
                failures = None
            if failures is not None:
                wait = max(wait, failures.locked_until - now)
            if wait > 0:
                return LoginVerdict(ok=False, retry_after_seconds=wait)
            if correct:
                self._clients.pop(client, None)
                return LoginVerdict(ok=True)
            self._recent.append(now)
            if failures is None:
                if len(self._clients) >= MAX_CLIENTS:
                    oldest = min(self._clients, key=lambda k: self._clients[k].last)
                    del self._clients[oldest]
                failures = self._clients[client] = _Failures(0, now, now)
            failures.count += 1
            failures.last = now
            beyond = failures.count - FREE_FAILURES
            if beyond >= 0:
                # capped exponent: 2 ** 20 s is far beyond the cap already
                delay = FIRST_LOCKOUT_SECONDS * 2 ** min(beyond, 20)
                failures.locked_until = now + min(delay, MAX_LOCKOUT_SECONDS)
            return LoginVerdict(ok=False)
