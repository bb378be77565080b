"""What the manager runs around a batch and around each handler.

A handler is called with the task and the batch's ORM session, inside the
batch transaction. The :class:`~sqla_queue.batch.manager.TaskManager` takes two
lists and knows nothing of what is in them:

- batch stages (:class:`BatchStage`: the pub/sub fan-out, the webhook
  delivery): :meth:`~BatchStage.prepare` before the batch transaction (a
  stage that made calls must have every outcome recorded),
  :meth:`~BatchStage.wrap` around the handler, :meth:`~BatchStage.forget`
  once the batch has ended;
- middleware (:class:`Middleware`: the time limit), which wraps the
  handler on the batch's connection, outermost last: as procrastinate's
  middleware, a list of callables nested around the handler by
  :func:`compose`. One list for sync and async workers: an async worker's
  handler returns its coroutine, which the time limit, innermost, awaits
  (``timelimit.py``); every layer outside it sees a finished call.

The worker's composition root (``worker/app.py``) builds both lists; it
adds, outermost, the middleware of the parts registered with
:func:`register_middleware` (the OpenTelemetry spans of ``tracing.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from ..schema.records import TaskRecord

__all__ = [
    "BatchStage",
    "Handler",
    "Middleware",
    "MiddlewareFactory",
    "compose",
    "register_middleware",
    "registered_middleware",
    "unregister_middleware",
]

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


class Middleware(Protocol):
    """Something that runs around every handler call (see the module)."""

    def wrap(self, handler: Handler, conn: Connection) -> Handler:
        """``handler``, run its way, for a batch on ``conn``."""
        ...


def compose(
    handler: Handler,
    conn: Connection,
    stages: Sequence[BatchStage],
    middleware: Sequence[Middleware],
) -> Handler:
    """``handler`` wrapped by each stage, then each middleware, in order:
    the first stage is innermost, the last middleware outermost."""
    for stage in stages:
        handler = stage.wrap(handler)
    for layer in middleware:
        handler = layer.wrap(handler, conn)
    return handler


#: builds a worker's middleware from its queue table's name
MiddlewareFactory = Callable[[str], Middleware]
_factories: list[MiddlewareFactory] = []


def register_middleware(factory: MiddlewareFactory) -> None:
    """Wrap the handlers of every worker built from now on in this process
    with ``factory(queue)`` (outermost; once, however often registered)."""
    if factory not in _factories:
        _factories.append(factory)


def unregister_middleware(factory: MiddlewareFactory) -> None:
    if factory in _factories:
        _factories.remove(factory)


def registered_middleware(queue: str) -> list[Middleware]:
    """The registered factories' middleware for a worker of ``queue``."""
    return [factory(queue) for factory in list(_factories)]
