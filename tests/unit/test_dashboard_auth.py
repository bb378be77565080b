"""The dashboard's session store and login throttle, on a clock the tests
move (the HTTP behaviour: tests/acceptance/test_dashboard.py)."""

from __future__ import annotations

import pytest

from sqla_queue.common.exceptions import ConfigurationError
from sqla_queue.ops.dashboard import auth
from sqla_queue.ops.dashboard.app import allowed_hosts
from sqla_queue.ops.dashboard.auth import LoginThrottle, SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def fail_until_locked(throttle: LoginThrottle, client: str) -> float:
    """Wrong passwords until the client is locked out; the lockout's length."""
    while True:
        verdict = throttle.attempt(client, correct=False)
        if verdict.throttled:
            return verdict.retry_after_seconds
        assert not verdict.ok


def test_a_client_lockout_doubles_up_to_fifteen_minutes_and_always_ends() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    assert [throttle.attempt("a", correct=False).ok for _ in range(5)] == [False] * 5
    seen = []
    for _ in range(20):
        wait = throttle.attempt("a", correct=True).retry_after_seconds
        assert wait > 0  # the right password, refused during the lockout
        seen.append(wait)
        clock.now += wait
        assert not throttle.attempt("a", correct=False).ok
    assert seen[:5] == [1, 2, 4, 8, 16] and max(seen) == auth.MAX_LOCKOUT_SECONDS
    clock.now += auth.MAX_LOCKOUT_SECONDS
    assert throttle.attempt("a", correct=True).ok
    # a correct login clears the count: five free failures again
    assert not any(throttle.attempt("a", correct=False).throttled for _ in range(5))


def test_a_lockout_is_per_client_and_forgotten_after_an_hour() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    fail_until_locked(throttle, "a")
    assert throttle.attempt("b", correct=True).ok
    clock.now += auth.FORGET_AFTER_SECONDS
    assert not any(throttle.attempt("a", correct=False).throttled for _ in range(5))


def test_failures_over_all_clients_are_capped_per_minute() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for n in range(auth.GLOBAL_FAILURES_PER_MINUTE):
        assert not throttle.attempt(f"10.0.0.{n}", correct=False).throttled
        clock.now += 1
    refused = throttle.attempt("192.0.2.1", correct=True)
    assert refused.throttled and refused.retry_after_seconds == 30
    clock.now += refused.retry_after_seconds
    assert throttle.attempt("192.0.2.1", correct=True).ok


def test_the_throttle_remembers_a_bounded_number_of_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "MAX_CLIENTS", 3)
    monkeypatch.setattr(auth, "GLOBAL_FAILURES_PER_MINUTE", 1000)
    clock = Clock()
    throttle = LoginThrottle(clock)
    for n in range(10):
        throttle.attempt(f"c{n}", correct=False)
        clock.now += 1
    assert len(throttle._clients) == 3


def test_sessions_expire_end_and_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    store = SessionStore(clock)
    operator = store.start("admin")
    assert len(operator.id) >= 43 and operator.csrf != operator.id  # 256 bits each
    visitor = store.start(None)
    clock.now += 60
    assert store.get(operator.id) is operator and operator.last_seen == clock.now
    clock.now += auth.ANONYMOUS_SECONDS
    assert store.get(visitor.id) is None
    assert store.get(operator.id) is operator
    clock.now = operator.expires
    assert store.get(operator.id) is None
    again = store.start("admin")
    store.end(again.id)
    assert store.get(again.id) is None and store.get(None) is None
    # a flood of login forms pushes out older visitors, never a logged-in session
    monkeypatch.setattr(auth, "MAX_SESSIONS", 5)
    kept = store.start("admin")
    visitors = [store.start(None) for _ in range(20)]
    assert store.get(kept.id) is kept
    assert [store.get(v.id) is not None for v in visitors] == [False] * 15 + [True] * 5


def test_allowed_hosts_are_names_without_ports() -> None:
    assert allowed_hosts(["Dash.Example:8780", "::1", "[fe80::1]:80", "*.corp.example", "*"]) == [
        "localhost",
        "127.0.0.1",
        "[::1]",
        "dash.example",
        "[fe80::1]",
        "*.corp.example",
        "*",
    ]
    for bad in ("", "a/b", "x:y", "a*.b", "*b.c", "[::1", "user@host", "[zz::1]", "a,b"):
        with pytest.raises(ConfigurationError, match="not a host name"):
            allowed_hosts([bad])
