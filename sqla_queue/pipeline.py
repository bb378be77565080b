"""What the manager runs around a batch and around each handler.

A handler is called with the task and the batch's ORM session, inside the
batch transaction. A batch stage (webhook delivery today) is a collaborator
the :class:`~sqla_queue.manager.TaskManager` calls without knowing which it
is: :meth:`BatchStage.prepare` before the batch transaction (a stage that
made calls must have every outcome recorded), :meth:`BatchStage.wrap`
around the handler, :meth:`BatchStage.forget` once the batch has ended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from .records import TaskRecord

__all__ = ["BatchStage", "Handler"]

#: a task's handler: its return value (text or None) is the success message
Handler = Callable[[TaskRecord, Session], Any]


class BatchStage(Protocol):
    """Work a claimed batch needs outside its transaction (see the module)."""

    def prepare(self, conn: Connection, tasks: Sequence[TaskRecord]) -> bool:
        """Run before the batch transaction, on ``conn`` (free: no transaction
        open); True when the batch must record every task's outcome,
        whatever happens next (calls were made that cannot be taken back)."""
        ...

    def wrap(self, handler: Handler) -> Handler:
        """``handler``, with this stage's tasks answered by their outcome."""
        ...

    def forget(self, ids: Iterable[int]) -> None:
        """The batch of ``ids`` has ended: drop what was kept for it."""
        ...

    def close(self) -> None:
        """The worker stops: release what the stage holds."""
        ...
