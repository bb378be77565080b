"""``WorkerBase``: subclass it, set ``model``, implement ``execute``.

::

    class Faturar(WorkerBase):
        model = Task
        def execute(self, payload, task, session):
            session.add(Invoice(...))          # commits with the 'sucesso'
            return "faturado"                   # stored in 'mensagem'

Run it with ``sqla-queue worker module:Faturar`` or ``Faturar().run()``.
"""

from __future__ import annotations

import abc
import logging
from typing import Any, ClassVar

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from ..exceptions import ConfigurationError
from ..mixins import QueueMixin
from ..records import TaskRecord
from ..retry import LinearBackoff
from ..settings import Settings

logger = logging.getLogger("sqla_queue.worker")


class WorkerBase(abc.ABC):
    """A queue's handler. Class attributes tune it; ``None`` means the
    environment's value (``QUEUE_MAX_RETRY``, ``QUEUE_BASE_INTERVAL_RETRY``)."""

    #: the QueueMixin model whose table this worker consumes
    model: ClassVar[type[QueueMixin]]
    #: attempts in all before the dead-letter run (seed: QUEUE_MAX_RETRY)
    max_retry: ClassVar[int | None] = None
    #: minutes; attempt n+1 waits n times this (seed: QUEUE_BASE_INTERVAL_RETRY)
    retry_interval_minutes: ClassVar[float | None] = None
    #: most tasks claimed and committed together; 1 = one task per transaction
    batch_size: ClassVar[int] = 100
    #: batches shrink so that one takes about this long (long tasks go one by one)
    batch_seconds: ClassVar[float] = 0.1
    #: each task in a transaction of its own (no batching): for handlers that
    #: set transaction-scoped state (SET LOCAL, set_config(..., true), the
    #: row-level-security tenant switch) that the next task must not inherit
    transaction_per_task: ClassVar[bool] = False
    #: seconds a claim lasts without a heartbeat (renewed every third of it
    #: while the handler runs); a dead worker's task is rescued after it
    lease_seconds: ClassVar[float] = 30.0
    #: per-task advisory locks / GET_LOCK, which let the rescue see a killed
    #: worker at once; None: SQLA_QUEUE_TASK_LOCKS (default true). Turn off
    #: behind a transaction-pooling PgBouncer (docs/pgbouncer.md)
    task_locks: ClassVar[bool | None] = None

    @abc.abstractmethod
    def execute(self, payload: Any, task: TaskRecord, session: Session) -> str | None:
        """Process one task. ``session`` is on the transaction that records
        the task's ``sucesso``: write through it and both commit together.
        Return a message for ``mensagem`` (or None); raise to fail."""

    def execute_dead(self, payload: Any, task: TaskRecord, session: Session) -> str | None:
        """Handle a dead-letter run (a task that exhausted its attempts)."""
        message = (
            f"Tarefa com ID {task.live_id} excedeu o número de tentativas, sem sucesso. "
            "Será necessária intervenção manual."
        )
        logger.warning(message)
        return message

    def dispatch(self, task: TaskRecord, session: Session) -> str | None:
        """Route a claimed task to its handler (pub/sub workers extend this)."""
        if task.dead:
            return self.execute_dead(task.payload, task, session)
        return self.execute(task.payload, task, session)

    def backoff(self, settings: Settings) -> LinearBackoff:
        return LinearBackoff(
            max_attempts=self.max_retry if self.max_retry is not None else settings.max_retry,
            base_interval_minutes=(
                self.retry_interval_minutes
                if self.retry_interval_minutes is not None
                else settings.base_interval_retry_minutes
            ),
        )

    @classmethod
    def queue_model(cls) -> type[QueueMixin]:
        model = getattr(cls, "model", None)
        if not (
            isinstance(model, type)
            and issubclass(model, QueueMixin)
            and hasattr(model, "__table__")
        ):
            raise ConfigurationError(
                f"{cls.__name__}.model must be a mapped QueueMixin model, not {model!r}"
            )
        return model

    def run(
        self,
        url: str | URL | None = None,
        *,
        engine: Engine | None = None,
        concurrency: int = 1,
        burst: bool = False,
        batch_size: int | None = None,
        settings: Settings | None = None,
    ) -> int:
        """Process tasks until stopped (or, with ``burst``, until none is
        ready). Returns the process exit status (0)."""
        from .runner import Runner

        return Runner(
            self,
            url=url,
            engine=engine,
            concurrency=concurrency,
            burst=burst,
            batch_size=batch_size,
            settings=settings,
        ).run()
