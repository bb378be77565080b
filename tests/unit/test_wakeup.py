"""Idle lanes are woken one at a time (sqla_queue/worker/wakeup.py)."""

from __future__ import annotations

import threading
import time

from sqla_queue.worker.wakeup import LaneWakeup
from tests.conftest import wait_until


def _waiters(wake: LaneWakeup, count: int) -> tuple[list[threading.Thread], list[bool]]:
    woken: list[bool] = []
    ready = threading.Barrier(count + 1)

    def lane() -> None:
        ready.wait()
        woken.append(wake.wait(timeout=30))

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    return threads, woken


def _waiting(wake: LaneWakeup) -> int:
    return len(wake._condition._waiters)  # type: ignore[attr-defined]


def test_set_wakes_one_waiting_lane_and_set_all_every_lane() -> None:
    wake = LaneWakeup(8)
    threads, woken = _waiters(wake, 8)
    wait_until(lambda: _waiting(wake) == 8, timeout=10, message="8 lanes waiting")
    wake.set()
    wait_until(lambda: len(woken) == 1, timeout=10, message="one lane woken")
    # one notify, one waiter: the other seven still wait, the wake-up is taken
    assert _waiting(wake) == 7 and woken == [True] and not wake.is_set()
    wake.set_all()
    for thread in threads:
        thread.join(timeout=10)
    assert woken == [True] * 8


def test_a_wake_up_while_no_lane_waits_is_kept_one_per_lane_at_most() -> None:
    wake = LaneWakeup(2)
    for _ in range(5):  # a burst of notifications while both lanes were busy
        wake.set()
    assert wake.is_set()
    assert wake.wait(timeout=0) and wake.wait(timeout=0)  # one claim each, no more
    assert not wake.is_set()
    started = time.monotonic()
    assert wake.wait(timeout=0.05) is False  # the fallback poll's timeout
    assert time.monotonic() - started >= 0.04
