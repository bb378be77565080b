"""Workers: the handler base class and the runner that drives it."""

from __future__ import annotations

from .base import WorkerBase
from .pubsub import WorkerPubSubBase, dead_subscriber, subscriber
from .runner import Runner
from .webhook import SubscriberWebhook, WorkerWebhook

__all__ = [
    "Runner",
    "SubscriberWebhook",
    "WorkerBase",
    "WorkerPubSubBase",
    "WorkerWebhook",
    "dead_subscriber",
    "subscriber",
]
