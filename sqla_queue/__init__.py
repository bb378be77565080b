"""sqla-queue: transactional job queues inside your SQLAlchemy database.

Enqueue in the same transaction as the business change; a task leaves the
queue in the same transaction as the work that consumed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _moved
from .client.queue import QueueClient
from .client.workflow import Workflow, chain, group
from .common.exceptions import (
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
from .common.payload import JsonText
from .config.settings import Settings, normalize_url
from .enqueue import events as _events
from .enqueue import flush_insert as _flush_insert
from .enqueue.events import install, uninstall
from .enqueue.unique import Unique, duplicate_of
from .maintenance.periodic import Periodic
from .ops import status_counts as _status_summary  # noqa: F401  (<table>_status, made with the queue table)
from .schema.mixins import DEFAULT_PRIORITY, QueueMixin, Status
from .schema.payload_keys import payload_key
from .schema.records import TaskRecord
from .schema.subscribers import SubscriberMixin, SubscriptionRecord
from .worker import (
    SubscriberWebhook,
    WorkerBase,
    WorkerPubSubBase,
    WorkerWebhook,
    dead_subscriber,
    subscriber,
)

if TYPE_CHECKING:
    from .client.aio import AsyncQueueClient as AsyncQueueClient
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
    "Workflow",
    "chain",
    "dead_subscriber",
    "duplicate_of",
    "group",
    "install",
    "normalize_url",
    "payload_key",
    "subscriber",
    "uninstall",
]

_events.set_fast_writer(_flush_insert.write_new_tasks)


def __getattr__(name: str) -> Any:
    # imported on first use: sqla_queue.client.aio imports sqlalchemy.ext.asyncio,
    # which needs greenlet, and sync code runs without it
    if name == "AsyncQueueClient":
        from .client.aio import AsyncQueueClient

        return AsyncQueueClient
    # and the running worker's parts: a command that only acts on rows
    # (worker/operator.py) skips them
    if name in ("QueueApp", "Runner"):
        from . import worker

        return getattr(worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_moved.install()
