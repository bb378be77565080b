"""Workers: the handler base class and the runner that drives it."""

from __future__ import annotations

from .base import WorkerBase
from .pubsub import WorkerPubSubBase, dead_subscriber, subscriber
from .runner import Runner

__all__ = ["Runner", "WorkerBase", "WorkerPubSubBase", "dead_subscriber", "subscriber"]
