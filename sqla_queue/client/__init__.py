"""The application's side: enqueue, requeue, control, pause, tenants.

This package was the module ``client.py``: its public names are here still."""

from .queue import (
    QueueClient,
    resolve_table,
)

__all__ = [
    "QueueClient",
    "resolve_table",
]
