"""Workers: the handler base class, the composition root that builds a
worker's parts (QueueApp) and the runner that drives them."""

from __future__ import annotations

from .app import QueueApp
from .base import WorkerBase
from .pubsub import WorkerPubSubBase, dead_subscriber, subscriber
from .runner import Runner
from .webhook import SubscriberWebhook, WorkerWebhook

__all__ = [
    "QueueApp",
    "Runner",
    "SubscriberWebhook",
    "WorkerBase",
    "WorkerPubSubBase",
    "WorkerWebhook",
    "dead_subscriber",
    "subscriber",
]
