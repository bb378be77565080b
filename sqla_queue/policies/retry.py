"""When a failed task runs again: the retry policies.

``LinearBackoff`` is the seed's rule, the default: attempt *n* failed, so
attempt *n+1* runs ``n * QUEUE_BASE_INTERVAL_RETRY`` minutes later, up to
``QUEUE_MAX_RETRY`` attempts in all. (The reference measured the delay from
the failed row's ``data_hora``, so a task that waited long in the queue was
retried at once; here it is measured from the failure.)

``ExponentialBackoff`` is PEQ's formula: after the *n*-th failure (PEQ's
``numberOfRetries``, counted from 1), the next attempt waits
``backoff_base * backoff_factor ** n`` seconds plus a random jitter between
``backoff_jitter_min`` and ``backoff_jitter_max`` seconds (PEQ's defaults:
10, 2, 11, 99: from about half a minute to seven minutes over five
retries). The wait stops growing at ``MAX_DELAY`` (thirty days), so a large
attempt number never overflows a date.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from ..common.exceptions import ConfigurationError
from ..config.ranges import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_FACTOR,
    BACKOFF_JITTER_SECONDS,
    BASE_INTERVAL_MINUTES,
    MAX_RETRY,
)

__all__ = [
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_FACTOR",
    "BACKOFF_JITTER_SECONDS",
    "MAX_DELAY",
    "ExponentialBackoff",
    "LinearBackoff",
    "RetryPolicy",
]

#: the longest wait an exponential policy computes
MAX_DELAY = dt.timedelta(days=30)


class RetryPolicy(Protocol):
    @property
    def max_attempts(self) -> int: ...

    def next_attempt_at(self, attempt: int, failed_at: dt.datetime) -> dt.datetime | None:
        """When attempt ``attempt + 1`` runs; None when ``attempt`` was the last."""
        ...


@dataclass(frozen=True)
class LinearBackoff:
    max_attempts: int = 100
    base_interval_minutes: float = 5.0

    def __post_init__(self) -> None:
        # Named after these parameters: a worker checks its own values first
        # (WorkerBase.backoff) and names the class attribute or the variable
        # they came from; this only catches a LinearBackoff built by hand.
        MAX_RETRY.check("LinearBackoff max_attempts", self.max_attempts)
        BASE_INTERVAL_MINUTES.check(
            "LinearBackoff base_interval_minutes", self.base_interval_minutes
        )

    def next_attempt_at(self, attempt: int, failed_at: dt.datetime) -> dt.datetime | None:
        """When attempt ``attempt + 1`` runs; None when ``attempt`` was the last."""
        if attempt >= self.max_attempts:
            return None
        return failed_at + dt.timedelta(minutes=attempt * self.base_interval_minutes)


@dataclass(frozen=True)
class ExponentialBackoff:
    max_attempts: int = 7
    base_seconds: float = 10.0
    factor: float = 2.0
    jitter_min_seconds: float = 11.0
    jitter_max_seconds: float = 99.0
    #: the jitter's source; a seeded ``random.Random`` makes it repeatable
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        MAX_RETRY.check("ExponentialBackoff max_attempts", self.max_attempts)
        BACKOFF_BASE_SECONDS.check("ExponentialBackoff base_seconds", self.base_seconds)
        BACKOFF_FACTOR.check("ExponentialBackoff factor", self.factor)
        for name in ("jitter_min_seconds", "jitter_max_seconds"):
            BACKOFF_JITTER_SECONDS.check(f"ExponentialBackoff {name}", getattr(self, name))
        if self.jitter_min_seconds > self.jitter_max_seconds:
            raise ConfigurationError(
                f"backoff_jitter_min ({self.jitter_min_seconds:g}) must not exceed "
                f"backoff_jitter_max ({self.jitter_max_seconds:g})"
            )

    def delay_seconds(self, attempt: int) -> float:
        """The wait after failure number ``attempt`` (1 for the first), jitter included."""
        cap = MAX_DELAY.total_seconds()
        if self.base_seconds > 0 and attempt * math.log(self.factor) < math.log(cap):
            delay = min(self.base_seconds * self.factor**attempt, cap)
        else:
            delay = 0.0 if self.base_seconds == 0 else cap
        jitter = self.rng.uniform(self.jitter_min_seconds, self.jitter_max_seconds)
        return min(delay + jitter, cap)

    def next_attempt_at(self, attempt: int, failed_at: dt.datetime) -> dt.datetime | None:
        if attempt >= self.max_attempts:
            return None
        return failed_at + dt.timedelta(seconds=self.delay_seconds(attempt))
