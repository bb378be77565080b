"""sqla-queue: transactional job queues inside your SQLAlchemy database.

Enqueue in the same transaction as the business change; a task leaves the
queue in the same transaction as the work that consumed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import events as _events
from . import flush_insert as _flush_insert
from . import status_summary as _status_summary  # noqa: F401  (<table>_status, made with the queue table)
from .client import QueueClient
from .events import install, uninstall
from .exceptions import (
    ConfigurationError,
    DuplicateTaskError,
    FanOutError,
    InvalidIdentifierError,
    InvalidTaskError,
    NotInstalledError,
    PayloadError,
    SqlaQueueError,
    SubscriberNotRegistered,
    TaskNotFoundError,
    TaskStateError,
    UnpreparedTaskError,
    UnsupportedOperationError,
)
from .maintenance.periodic import Periodic
from .mixins import DEFAULT_PRIORITY, QueueMixin, Status
from .payload import JsonText
from .payload_keys import payload_key
from .records import TaskRecord
from .settings import Settings, normalize_url
from .subscribers import SubscriberMixin, SubscriptionRecord
from .unique import Unique, duplicate_of
from .worker import (
    SubscriberWebhook,
    WorkerBase,
    WorkerPubSubBase,
    WorkerWebhook,
    dead_subscriber,
    subscriber,
)

if TYPE_CHECKING:
    from .aio import AsyncQueueClient as AsyncQueueClient
    from .worker.app import QueueApp as QueueApp
    from .worker.runner import Runner as Runner

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PRIORITY",
    "ConfigurationError",
    "DuplicateTaskError",
    "FanOutError",
    "InvalidIdentifierError",
    "InvalidTaskError",
    "JsonText",
    "NotInstalledError",
    "PayloadError",
    "Periodic",
    "QueueApp",
    "QueueClient",
    "QueueMixin",
    "Runner",
    "Settings",
    "SqlaQueueError",
    "Status",
    "SubscriberMixin",
    "SubscriberNotRegistered",
    "SubscriberWebhook",
    "SubscriptionRecord",
    "TaskNotFoundError",
    "TaskRecord",
    "TaskStateError",
    "Unique",
    "UnpreparedTaskError",
    "UnsupportedOperationError",
    "WorkerBase",
    "WorkerPubSubBase",
    "WorkerWebhook",
    "dead_subscriber",
    "duplicate_of",
    "install",
    "normalize_url",
    "payload_key",
    "subscriber",
    "uninstall",
]

_events.set_fast_writer(_flush_insert.write_new_tasks)


def __getattr__(name: str) -> Any:
    # imported on first use: sqla_queue.aio imports sqlalchemy.ext.asyncio,
    # which needs greenlet, and sync code runs without it
    if name == "AsyncQueueClient":
        from .aio import AsyncQueueClient

        return AsyncQueueClient
    # and the running worker's parts: a command that only acts on rows
    # (worker/operator.py) skips them
    if name in ("QueueApp", "Runner"):
        from . import worker

        return getattr(worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
