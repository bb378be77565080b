"""When a failed task runs again.

``LinearBackoff`` is the seed's rule: attempt *n* failed, so attempt *n+1*
runs ``n * QUEUE_BASE_INTERVAL_RETRY`` minutes later, up to
``QUEUE_MAX_RETRY`` attempts in all. (The reference measured the delay from
the failed row's ``data_hora``, so a task that waited long in the queue was
retried at once; here it is measured from the failure.)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .settings import BASE_INTERVAL_MINUTES, MAX_RETRY


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
