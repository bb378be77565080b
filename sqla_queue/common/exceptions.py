"""Every error sqla-queue raises on purpose.

All of them subclass :class:`SqlaQueueError`; each docstring is the default
message, so ``raise NotInstalledError()`` already tells the user what to do.
"""

from __future__ import annotations


class SqlaQueueError(Exception):
    """sqla-queue failed."""

    def __init__(self, message: str | None = None) -> None:
        # the docstring, on one line: it is wrapped in the source only
        super().__init__(message or " ".join((self.__doc__ or "").split()))


class ConfigurationError(SqlaQueueError, ValueError):
    """The configuration is invalid."""


class InvalidIdentifierError(ConfigurationError):
    """A schema, table or channel name is not a valid SQL identifier."""


class InvalidTaskError(SqlaQueueError, ValueError):
    """A task's value cannot be stored in its column; nothing was written.
    ``column`` (the seed column) and ``problem`` say which and why, when known."""

    def __init__(self, message: str, *, column: str | None = None, problem: str | None = None):
        super().__init__(message)
        self.column = column
        self.problem = problem


class PayloadError(InvalidTaskError):
    """The payload cannot be serialised to JSON."""


class NotInstalledError(SqlaQueueError):
    """A queue task is being flushed by a Session that sqla-queue is not
    installed on: call ``sqla_queue.install(Session)`` once at start-up."""


class UnpreparedTaskError(SqlaQueueError):
    """A queue task reached the database without sqla-queue's flush hook
    (``session.bulk_save_objects()`` and ``bulk_insert_mappings()`` skip it):
    enqueue with ``session.add_all()`` or ``QueueClient.insert_tasks()``."""


class UnsupportedOperationError(SqlaQueueError):
    """This database does not support the operation."""


class WorkerImportError(ConfigurationError):
    """The worker class could not be imported; give it as ``module:Class``."""


class WorkerDatabaseError(SqlaQueueError):
    """A ``--burst`` worker stopped on a database error (unreachable, refused)."""


class SubscriberNotRegistered(SqlaQueueError):
    """A pub/sub copy names a subscriber id that its worker class has no
    ``@subscriber`` method for (the copy fails and retries, never dropped)."""


class FanOutError(SqlaQueueError):
    """A publication cannot be fanned out to its subscribers."""


class SparkSetupError(ConfigurationError):
    """Spark cannot start: PySpark, Java or a JDBC driver jar is missing."""


class SparkJobError(SqlaQueueError):
    """A Spark job of sqla-queue failed."""


class TaskNotFoundError(SqlaQueueError, LookupError):
    """No task has this id in the queue table."""


class TaskStateError(SqlaQueueError):
    """The task is not in a state the operation applies to (cancel takes a
    pending or scheduled task, retry-now a scheduled one)."""


class DuplicateTaskError(SqlaQueueError):
    """A unique task is already in the queue (``__queue_unique__``, policy
    ``error``; sqla_queue/enqueue/unique.py)."""


class SQLAlchemyChangedError(SqlaQueueError):
    """This SQLAlchemy release lacks a private name sqla-queue relies on
    (sqla_queue/adapters/sqla_private.py): use a SQLAlchemy version that
    pyproject.toml allows."""
