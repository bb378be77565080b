"""Workers: the handler base class, the composition root that builds a
worker's parts (QueueApp) and the runners that drive them (``AsyncRunner``,
for coroutine handlers, imported on first use: it needs greenlet)."""

from __future__ import annotations

from typing import Any

from .app import QueueApp
from .base import WorkerBase
from .pubsub import WorkerPubSubBase, dead_subscriber, subscriber
from .runner import Runner
from .webhook import SubscriberWebhook, WorkerWebhook

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
    if name == "AsyncRunner":
        from .aio import AsyncRunner

        return AsyncRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
