"""sqla-queue: transactional job queues inside your SQLAlchemy database.

Enqueue in the same transaction as the business change; a task leaves the
queue in the same transaction as the work that consumed it.
"""

from __future__ import annotations

from .client import QueueClient
from .events import install, uninstall
from .exceptions import (
    ConfigurationError,
    InvalidIdentifierError,
    NotInstalledError,
    PayloadError,
    SqlaQueueError,
    UnpreparedTaskError,
    UnsupportedOperationError,
)
from .mixins import QueueMixin, Status
from .payload import JsonText
from .records import TaskRecord
from .worker import WorkerBase

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "InvalidIdentifierError",
    "JsonText",
    "NotInstalledError",
    "PayloadError",
    "QueueClient",
    "QueueMixin",
    "SqlaQueueError",
    "Status",
    "TaskRecord",
    "UnpreparedTaskError",
    "UnsupportedOperationError",
    "WorkerBase",
    "install",
    "uninstall",
]
