"""Routing by process: which tasks of its table a worker class claims.

``processes`` (a class attribute of any worker: a set of ``processo``
names, or None for all, the seed's behaviour) and, for a pub/sub worker, its
registered subscriber ids become a :class:`~sqla_queue.adapters.ClaimFilter`
that the runner gives its adapter; the adapter compiles it into its claim
statements once. Tasks outside the filter are never claimed, run or handed
back by that worker (the rescue of a dead worker's tasks, and the promotion
of due scheduled tasks, stay table-wide maintenance).
"""

from __future__ import annotations

from typing import Any

from ..adapters import ClaimFilter
from ..common.exceptions import ConfigurationError

__all__ = ["check_processes", "claim_filter_of"]

PROCESS_MAX_LENGTH = 250  # processo varchar(250)


def check_processes(owner: str, value: Any) -> frozenset[str] | None:
    """``value`` as a frozenset of process names, or None; a clear error
    naming ``owner`` (``Class.processes``) otherwise."""
    if value is None:
        return None
    if not isinstance(value, (set, frozenset)):
        raise ConfigurationError(
            f"{owner} must be a set or frozenset of process names, or None (all), "
            f"not {type(value).__name__}"
        )
    if not value:
        raise ConfigurationError(f"{owner} is empty: the worker would claim nothing (None = all)")
    for name in value:
        if not isinstance(name, str) or not name or len(name) > PROCESS_MAX_LENGTH:
            raise ConfigurationError(
                f"{owner} holds {name!r}: process names are non-empty strings of at most "
                f"{PROCESS_MAX_LENGTH} characters"
            )
    return frozenset(value)


def claim_filter_of(worker_class: type) -> ClaimFilter | None:
    """The claim filter of a worker class (None: it claims every task)."""
    processes = check_processes(
        f"{worker_class.__name__}.processes", getattr(worker_class, "processes", None)
    )
    routed = getattr(worker_class, "routed_subscriber_ids", None)
    subscriber_ids = frozenset(routed()) if callable(routed) else None
    if processes is None and subscriber_ids is None:
        return None
    return ClaimFilter(
        processes=processes,
        subscriber_ids=subscriber_ids,
        # the webhook worker: the copies of every subscription
        all_subscribers=bool(getattr(worker_class, "delivers_every_subscription", False)),
    )
