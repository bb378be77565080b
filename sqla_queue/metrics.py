"""Prometheus metrics of a worker process, counted from the after-commit
hooks (a rolled-back batch never counts), served by prometheus-client.

    sqla-queue worker myapp.workers:Billing --metrics-port 9464

or from Python, beside any worker of the process::

    from sqla_queue.metrics import QueueMetrics
    QueueMetrics(queue="fila_faturamento").attach()   # the process's hooks
    prometheus_client.start_http_server(9464)

=========================================  =========================================
metric                                     what
=========================================  =========================================
``sqla_queue_tasks_total``                 attempts by ``queue``, ``process``,
                                           ``outcome``: succeeded, failed, retried,
                                           dead, rescued, handed_back
``sqla_queue_task_duration_seconds``       a handler's run time (histogram)
``sqla_queue_task_wait_seconds``           ready to claimed: ``started_at -
                                           data_hora`` (histogram)
``sqla_queue_batch_size``                  tasks whose outcome a batch committed
                                           (histogram)
``sqla_queue_lanes``                       lanes of the process's workers
``sqla_queue_lanes_busy``                  lanes running a batch now
``sqla_queue_routine_runs_total``          maintenance routine runs by ``routine``
                                           and ``outcome`` (ok, error)
``sqla_queue_lane_reconnects_total``       lanes that lost their database
=========================================  =========================================

What each outcome is in the table (docs/operations.md, "Metrics"):
succeeded: an attempt became ``sucesso`` (a dead-letter run's too); retried:
``falha`` with ``reenfileirado``; dead: ``falha`` with
``estouro_tentativas``, its dead-letter run enqueued; failed: a dead-letter
run's last attempt failed; rescued: ``falha_processando`` (the rescue);
handed_back: back to ``pendente`` unrun, at a stop.

prometheus-client is in the ``metrics`` extra (``sqla-queue[metrics]``).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .exceptions import ConfigurationError
from .hooks import (
    BATCH_COMMITTED,
    LANE_RECONNECTED,
    ROUTINE_RAN,
    TASK_DEAD,
    TASK_FAILED,
    TASK_HANDED_BACK,
    TASK_RESCUED,
    TASK_RETRIED,
    TASK_SUCCEEDED,
    BatchEvent,
    Hooks,
    LaneEvent,
    RoutineEvent,
    TaskEvent,
    registry,
)
from .types import utcnow

__all__ = ["OUTCOMES", "QueueMetrics", "serve"]

#: a task event's outcome label
OUTCOMES = {
    TASK_SUCCEEDED: "succeeded",
    TASK_FAILED: "failed",
    TASK_RETRIED: "retried",
    TASK_DEAD: "dead",
    TASK_RESCUED: "rescued",
    TASK_HANDED_BACK: "handed_back",
}
_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'sqla-queue[metrics]'"
        ) from None
    return prometheus_client


class QueueMetrics:
    """The metrics of one queue's workers in this process (see the module).
    ``registry``: prometheus-client's (default: its global one)."""

    def __init__(self, queue: str, *, registry: Any = None) -> None:
        prometheus = _prometheus()
        self.queue = queue
        self.registry = registry if registry is not None else prometheus.REGISTRY
        kw = {"registry": self.registry}
        self.tasks = prometheus.Counter(
            "sqla_queue_tasks", "Task attempts by outcome", ["queue", "process", "outcome"], **kw
        )
        self.duration = prometheus.Histogram(
            "sqla_queue_task_duration_seconds",
            "How long a task's handler ran",
            ["queue", "process"],
            buckets=_SECONDS_BUCKETS,
            **kw,
        )
        self.wait = prometheus.Histogram(
            "sqla_queue_task_wait_seconds",
            "From ready (data_hora) to claimed (started_at)",
            ["queue", "process"],
            buckets=_SECONDS_BUCKETS,
            **kw,
        )
        self.batch = prometheus.Histogram(
            "sqla_queue_batch_size",
            "Tasks per committed batch",
            ["queue"],
            buckets=_BATCH_BUCKETS,
            **kw,
        )
        self.routines = prometheus.Counter(
            "sqla_queue_routine_runs",
            "Maintenance routine runs",
            ["queue", "routine", "outcome"],
            **kw,
        )
        self.reconnects = prometheus.Counter(
            "sqla_queue_lane_reconnects", "Lanes that lost their database", ["queue"], **kw
        )
        self._lanes = _LaneCollector(queue, prometheus)
        self.registry.register(self._lanes)
        # labelled children by (process, outcome): labels() costs a lookup per call
        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._lock = threading.Lock()
        self._hooks: Hooks | None = None
        self._observers: list[tuple[str, Callable[[Any], None]]] = [
            *((event, self._on_task) for event in OUTCOMES),
            (BATCH_COMMITTED, self._on_batch),
            (ROUTINE_RAN, self._on_routine),
            (LANE_RECONNECTED, self._on_reconnect),
        ]

    # ------------------------------------------------------------ wiring
    def attach(self, hooks: Hooks = registry) -> QueueMetrics:
        """Observe ``hooks`` (default: the process's registry)."""
        if self._hooks is not None:
            raise ConfigurationError("these metrics already observe a hooks registry")
        for event, observer in self._observers:
            hooks.add(event, observer)
        self._hooks = hooks
        return self

    def detach(self) -> None:
        """Stop observing, and unregister the metrics."""
        if self._hooks is not None:
            for event, observer in self._observers:
                self._hooks.remove(event, observer)
            self._hooks = None
        for collector in (
            self.tasks,
            self.duration,
            self.wait,
            self.batch,
            self.routines,
            self.reconnects,
            self._lanes,
        ):
            self.registry.unregister(collector)

    # ------------------------------------------------------------ observers
    def _child(self, process: str, outcome: str) -> tuple[Any, Any, Any]:
        key = (process, outcome)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children[key] = (
                    self.tasks.labels(self.queue, process, outcome),
                    self.duration.labels(self.queue, process),
                    self.wait.labels(self.queue, process),
                )
        return child

    def _on_task(self, event: TaskEvent) -> None:
        task = event.task
        counter, duration, wait = self._child(task.process or "", OUTCOMES[event.event])
        counter.inc()
        seconds = event.seconds
        if seconds is not None:
            duration.observe(seconds)
            ready = task.run_at
            if ready is not None:
                # started_at where the claim returned it (not on the MySQL
                # family): else the handler's start, a moment after the claim
                started = task.started_at or utcnow() - dt.timedelta(seconds=seconds)
                wait.observe(max(0.0, (started - ready).total_seconds()))

    def _on_batch(self, event: BatchEvent) -> None:
        # the tasks whose outcome the batch committed (a batch whose claim
        # was lost hands its tasks back and commits none)
        done = event.succeeded + event.failed
        if done:
            self.batch.labels(self.queue).observe(done)

    def _on_routine(self, event: RoutineEvent) -> None:
        outcome = "ok" if event.error is None else "error"
        self.routines.labels(self.queue, event.routine, outcome).inc()

    def _on_reconnect(self, event: LaneEvent) -> None:
        self.reconnects.labels(self.queue).inc()


class _LaneCollector:
    """``sqla_queue_lanes`` and ``sqla_queue_lanes_busy``, read from the
    process's running workers when scraped."""

    def __init__(self, queue: str, prometheus: Any) -> None:
        self.queue = queue
        from prometheus_client.core import GaugeMetricFamily

        self.gauge = GaugeMetricFamily

    def collect(self) -> Iterator[Any]:
        from .worker.runner import lanes_of

        lanes, busy = lanes_of(self.queue)
        total = self.gauge("sqla_queue_lanes", "Lanes of this process's workers", labels=["queue"])
        total.add_metric([self.queue], lanes)
        yield total
        running = self.gauge("sqla_queue_lanes_busy", "Lanes running a batch now", labels=["queue"])
        running.add_metric([self.queue], busy)
        yield running

    def describe(self) -> Iterator[Any]:
        return iter(())


def serve(port: int, *, host: str = "127.0.0.1", queue: str, registry: Any = None) -> QueueMetrics:
    """Attach a queue's metrics to the process's hooks and serve them as
    Prometheus text on ``http://host:port/metrics``, from a daemon thread."""
    prometheus = _prometheus()
    metrics = QueueMetrics(queue, registry=registry).attach()
    prometheus.start_http_server(port, addr=host, registry=metrics.registry)
    return metrics
