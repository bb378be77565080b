"""Workers: the handler base class, the composition root that builds a
worker's parts (QueueApp) and the runners that drive them (``AsyncRunner``,
for coroutine handlers); the runners and the root are imported on first
use (``AsyncRunner`` needs greenlet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import WorkerBase
from .pubsub import WorkerPubSubBase, dead_subscriber, subscriber
from .webhook import SubscriberWebhook, WorkerWebhook

if TYPE_CHECKING:
    from .aio import AsyncRunner
    from .app import QueueApp
    from .runner import Runner

__all__ = [
    "AsyncRunner",
    "QueueApp",
    "Runner",
    "SubscriberWebhook",
    "WorkerBase",
    "WorkerPubSubBase",
    "WorkerWebhook",
    "dead_subscriber",
    "subscriber",
]


def __getattr__(name: str) -> Any:
    # imported on first use: a command that only acts on rows (operator.py)
    # skips the parts a running worker needs (limits, fairness, stages)
    if name == "AsyncRunner":
        from .aio import AsyncRunner

        return AsyncRunner
    if name == "QueueApp":
        from .app import QueueApp

        return QueueApp
    if name == "Runner":
        from .runner import Runner

        return Runner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
