"""Observers of what a worker did, called once it is durable.

An application registers a callable for an event; the worker calls it
after the transaction that made the event true has committed, never
before (a task counted as succeeded by an observer has its ``sucesso`` and
its handler's work in the database). Observers run in the worker's threads
(a lane's, a routine's): keep them quick. An observer that raises is logged
and the worker carries on; the task's outcome stands.

    from sqla_queue import hooks

    @hooks.on(hooks.TASK_SUCCEEDED)
    def count(event: hooks.TaskEvent) -> None:
        metrics.increment("billed", tags={"process": event.task.process})

Events and what they carry:

===================  ===============  ==========================================
event                carries          when
===================  ===============  ==========================================
``task_succeeded``   TaskEvent        its ``sucesso`` committed (a dead-letter
                                      run's too: ``event.task.dead``)
``task_retried``     TaskEvent        its failure and its next attempt committed
``task_dead``        TaskEvent        its failure and its dead-letter run
                                      committed (its attempts are spent, or
                                      its error is in ``no_retry``)
``task_failed``      TaskEvent        a failure with nothing after it (a
                                      dead-letter run that failed)
``task_rescued``     TaskEvent        the rescue found its worker gone and
                                      committed its failure and retry
``task_handed_back`` TaskEvent        back to ``pendente`` unstarted (a stop)
``batch_committed``  BatchEvent       a batch's transaction committed
``routine_ran``      RoutineEvent     a maintenance routine ran on its
                                      schedule (its counts, error, time)
``lane_reconnected`` LaneEvent        a lane lost its database and reconnects
===================  ===============  ==========================================

``hooks.on`` registers on the process's registry, which every worker uses
unless given another (``QueueApp(..., hooks=Hooks())``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from ..common.exceptions import ConfigurationError
from ..common.redaction import describe_error
from ..schema.records import TaskRecord

__all__ = [
    "BATCH_COMMITTED",
    "EVENTS",
    "LANE_RECONNECTED",
    "ROUTINE_RAN",
    "TASK_DEAD",
    "TASK_EVENTS",
    "TASK_FAILED",
    "TASK_HANDED_BACK",
    "TASK_RESCUED",
    "TASK_RETRIED",
    "TASK_SUCCEEDED",
    "WORKFLOW_FINISHED",
    "BatchEvent",
    "Hooks",
    "LaneEvent",
    "RoutineEvent",
    "TaskEvent",
    "WorkflowEvent",
    "on",
    "registry",
]

logger = logging.getLogger("sqla_queue.policies.hooks")

TASK_SUCCEEDED = "task_succeeded"
TASK_RETRIED = "task_retried"
TASK_DEAD = "task_dead"
TASK_FAILED = "task_failed"
TASK_RESCUED = "task_rescued"
TASK_HANDED_BACK = "task_handed_back"
BATCH_COMMITTED = "batch_committed"
ROUTINE_RAN = "routine_ran"
LANE_RECONNECTED = "lane_reconnected"
#: a workflow ended: every step without children succeeded (or, under
#: ``continue``, ended), or a step went to the dead letter (docs/workflows.md)
WORKFLOW_FINISHED = "workflow_finished"
#: the events of one task's attempt
TASK_EVENTS = (TASK_SUCCEEDED, TASK_RETRIED, TASK_DEAD, TASK_FAILED, TASK_RESCUED, TASK_HANDED_BACK)
EVENTS = frozenset(
    {*TASK_EVENTS, BATCH_COMMITTED, ROUTINE_RAN, LANE_RECONNECTED, WORKFLOW_FINISHED}
)


class TaskEvent(NamedTuple):
    """One attempt's outcome. ``message``: what its ``mensagem`` says;
    ``seconds``: how long its handler ran (None: it did not run here).

    Immutable, as the other events; a named tuple rather than a frozen
    dataclass because one is built per task, and a named tuple is the
    cheaper to build (docs/benchmarks.md, "Figures formerly in code comments")."""

    event: str
    task: TaskRecord
    message: str | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class BatchEvent:
    """A committed batch: how many tasks it took and what became of them."""

    event: str
    tasks: int
    succeeded: int
    failed: int
    handed_back: int
    seconds: float


@dataclass(frozen=True)
class RoutineEvent:
    """A maintenance routine's run: its name, its counts, its error if any."""

    event: str
    routine: str
    counts: dict[str, int]
    error: str | None
    seconds: float


@dataclass(frozen=True)
class WorkflowEvent:
    """A workflow's outcome, told after the commit that decided it:
    ``succeeded`` or ``failed`` (a step went to the dead letter)."""

    event: str
    queue: str
    workflow_id: int
    outcome: str


@dataclass(frozen=True)
class LaneEvent:
    """A lane lost its database (``why``: the error, on one line)."""

    event: str
    lane: int
    why: str


F = TypeVar("F", bound=Callable[..., Any])


class Hooks:
    """A registry of observers by event (see the module)."""

    def __init__(self) -> None:
        self._observers: dict[str, tuple[Callable[[Any], Any], ...]] = {}
        self._lock = threading.Lock()

    def on(self, event: str) -> Callable[[F], F]:
        """A decorator that registers its function for ``event``."""
        _check(event)

        def register(function: F) -> F:
            self.add(event, function)
            return function

        return register

    def add(self, event: str, observer: Callable[[Any], Any]) -> None:
        _check(event)
        with self._lock:
            self._observers[event] = (*self._observers.get(event, ()), observer)

    def remove(self, event: str, observer: Callable[[Any], Any]) -> None:
        """Unregister ``observer`` (nothing happens if it is not registered)."""
        with self._lock:
            kept = tuple(o for o in self._observers.get(event, ()) if o is not observer)
            self._observers[event] = kept

    def wanted(self, *events: str) -> bool:
        """Whether anything observes one of ``events`` (skip building them if not)."""
        observers = self._observers
        return any(observers.get(event) for event in events)

    def emit(self, events: Iterable[Any]) -> None:
        """Call each event's observers; an observer's error is logged only."""
        for item in events:
            for observer in self._observers.get(item.event, ()):
                try:
                    observer(item)
                except Exception as exc:
                    logger.warning(
                        "observer %s of %s raised: %s",
                        getattr(observer, "__qualname__", observer),
                        item.event,
                        describe_error(exc),
                    )


def _check(event: str) -> None:
    if event not in EVENTS:
        raise ConfigurationError(f"no event {event!r}: one of {', '.join(sorted(EVENTS))}")


#: the process's registry: every worker uses it unless given another
registry = Hooks()
#: ``@hooks.on(event)`` on the process's registry
on = registry.on
