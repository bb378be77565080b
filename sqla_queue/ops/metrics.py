"""Prometheus metrics of a worker process, counted from the after-commit
hooks (a rolled-back batch never counts), served by prometheus-client.

    sqla-queue worker myapp.workers:Billing --metrics-port 9464

or from Python, beside any worker of the process::

    from sqla_queue.ops.metrics import QueueMetrics
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
``sqla_queue_tasks_in_state``              tasks (chains) by ``queue`` and ``state``:
                                           ready, scheduled, running, retrying,
                                           succeeded, failed, cancelled, dead_letter
                                           (``sqla-queue worker --metrics-port``)
=========================================  =========================================

What each outcome is in the table (docs/operations.md, "Metrics"):
succeeded: an attempt became ``sucesso`` (a dead-letter run's too); retried:
``falha`` with ``reenfileirado``; dead: ``falha`` with
``estouro_tentativas``, its dead-letter run enqueued; failed: a dead-letter
run's last attempt failed; rescued: ``falha_processando`` (the rescue);
handed_back: back to ``pendente`` unrun, at a stop.

These count attempts, as a worker ends them; ``sqla-queue status`` counts
tasks (a chain of attempts, in one state each). A cancellation is neither
here: ``sqla-queue cancel`` (``QueueClient.cancel``, the dashboard) ends a
waiting task outside any worker, where no worker's hook hears of it, and
these attempt counters never see it. The gauge ``sqla_queue_tasks_in_state`` does:
it is the table's count of tasks per state, ``status --json``'s totals
(``cancelled`` and ``dead_letter`` states of their own), read from the
database when scraped, at most once every ``TASK_STATES_EVERY_SECONDS``
(:class:`TaskStates`; the count keeps per-range tallies, docs/operations.md).

The ``process`` label is bounded whatever the table holds (each value is a
series of every family that has it, kept for the process's life): a worker
that declares its ``processes`` labels those and counts every other
``processo`` (a rescued task of another worker's, say) as ``other``; one
that takes every process labels the first ``PROCESS_LABELS_MAX`` distinct
values it sees and the rest as ``other``. A value's control characters are
written as visible escapes (``\\x0a``) and it is cut to
``PROCESS_LABEL_MAX_CHARS`` characters.

prometheus-client is in the ``metrics`` extra (``sqla-queue[metrics]``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator
from typing import Any

from ..common.exceptions import ConfigurationError
from ..common.redaction import describe_error, escape_controls
from ..common.types import utcnow
from ..policies.hooks import (
    BATCH_COMMITTED,
    LANE_RECONNECTED,
    ROUTINE_RAN,
    TASK_DEAD,
    TASK_FAILED,
    TASK_HANDED_BACK,
    TASK_RESCUED,
    TASK_RETRIED,
    TASK_SUCCEEDED,
    WORKFLOW_FINISHED,
    BatchEvent,
    Hooks,
    LaneEvent,
    RoutineEvent,
    TaskEvent,
    WorkflowEvent,
    registry,
)

logger = logging.getLogger("sqla_queue.metrics")

__all__ = [
    "OTHER_PROCESS",
    "OUTCOMES",
    "PROCESS_LABELS_MAX",
    "PROCESS_LABEL_MAX_CHARS",
    "TASK_STATES_EVERY_SECONDS",
    "QueueMetrics",
    "TaskStates",
    "serve",
]

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
# the same bounds as durations, to bisect a wait without converting it
_WAIT_BUCKETS = tuple(dt.timedelta(seconds=bound) for bound in _SECONDS_BUCKETS)
_ZERO = dt.timedelta(0)
#: the ``process`` label of every process beyond the labelled ones
OTHER_PROCESS = "other"
#: distinct ``process`` label values of a worker that declares no
#: ``processes``, before the rest count as ``other``
PROCESS_LABELS_MAX = 100
#: characters of a ``process`` label value (a longer name is cut)
PROCESS_LABEL_MAX_CHARS = 100
#: the least time between two reads of ``sqla_queue_tasks_in_state`` from the database
TASK_STATES_EVERY_SECONDS = 15.0


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
    ``registry``: prometheus-client's (default: its global one);
    ``processes``: the workers' declared ``processes`` (None: they take
    every process), the ``process`` label's only values besides ``other``;
    ``most_processes``: without them, the distinct values labelled."""

    def __init__(
        self,
        queue: str,
        *,
        registry: Any = None,
        processes: Collection[str] | None = None,
        most_processes: int = PROCESS_LABELS_MAX,
    ) -> None:
        prometheus = _prometheus()
        if most_processes < 0:
            raise ConfigurationError(f"most_processes must be 0 or more, not {most_processes}")
        self.queue = queue
        self._process_label = _ProcessLabels(processes, most_processes)
        self.registry = registry if registry is not None else prometheus.REGISTRY
        kw = {"registry": self.registry}
        # per task: counted here, one lock per event, read when scraped
        # (prometheus-client's Counter and Histogram took five locks and a
        # scan of the buckets per task)
        self._figures = _TaskFigures(queue)
        self.registry.register(self._figures)
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
        self.workflows = prometheus.Counter(
            "sqla_queue_workflows",
            "Workflows ended, by outcome (counted by the worker whose commit ended them)",
            ["queue", "outcome"],
            **kw,
        )
        self._lanes = _LaneCollector(queue, prometheus)
        self.registry.register(self._lanes)
        self._hooks: Hooks | None = None
        self._observers: list[tuple[str, Callable[[Any], None]]] = [
            *((event, self._on_task) for event in OUTCOMES),
            (BATCH_COMMITTED, self._on_batch),
            (ROUTINE_RAN, self._on_routine),
            (LANE_RECONNECTED, self._on_reconnect),
            (WORKFLOW_FINISHED, self._on_workflow),
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
            self._figures,
            self.batch,
            self.routines,
            self.reconnects,
            self.workflows,
            self._lanes,
        ):
            self.registry.unregister(collector)

    # ------------------------------------------------------------ observers
    def _on_task(self, event: TaskEvent) -> None:
        task = event.task
        seconds = event.seconds
        wait = None
        if seconds is not None:
            ready = task.run_at
            if ready is not None:
                # started_at where the claim returned it (not on the MySQL
                # family): else the handler's start, a moment after the claim
                started = task.started_at or utcnow() - dt.timedelta(seconds=seconds)
                wait = started - ready
        process = self._process_label(task.process or "")
        self._figures.add(process, OUTCOMES[event.event], seconds, wait)

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

    def _on_workflow(self, event: WorkflowEvent) -> None:
        self.workflows.labels(self.queue, event.outcome).inc()


class _ProcessLabels:
    """A task's ``processo`` -> its ``process`` label value: a declared
    process, or one of the first ``most`` distinct values seen when none
    are declared, else ``other`` (see the module). Known names are looked
    up without a lock; the cache of names is bounded like the labels."""

    def __init__(self, processes: Collection[str] | None, most: int) -> None:
        self._closed = processes is not None
        self._most = most
        self._lock = threading.Lock()
        self._labels = {process: _label_value(process) for process in processes or ()}
        self._seen = set(self._labels.values())

    def __call__(self, process: str) -> str:
        label = self._labels.get(process)
        if label is not None:
            return label
        if self._closed:
            return OTHER_PROCESS
        label = _label_value(process)
        with self._lock:
            if label not in self._seen:
                if len(self._seen) >= self._most:
                    return OTHER_PROCESS
                self._seen.add(label)
            # names whose label is one of the kept (a cut name has many)
            if len(self._labels) < 4 * self._most:
                self._labels[process] = label
        return label


def _label_value(process: str) -> str:
    return escape_controls(process)[:PROCESS_LABEL_MAX_CHARS]


class _Tally:
    """One thread's counts: by (process, outcome), and per process the
    duration and wait histograms' bucket counts (the last is +Inf) and sums."""

    __slots__ = ("counts", "seconds")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.seconds: dict[str, tuple[list[int], list[float], list[int], list[dt.timedelta]]] = {}


class _Histograms:
    """Summed over threads: a process's duration (0) and wait (1) buckets."""

    def __init__(self) -> None:
        empty = len(_SECONDS_BUCKETS) + 1
        self.buckets = ([0] * empty, [0] * empty)
        self.sums = [0.0, 0.0]

    def add(self, which: int, buckets: list[int], total: float) -> None:
        mine = self.buckets[which]
        for index, n in enumerate(buckets):
            mine[index] += n
        self.sums[which] += total


class _TaskFigures:
    """``sqla_queue_tasks_total``, ``sqla_queue_task_duration_seconds`` and
    ``sqla_queue_task_wait_seconds``: plain counts, one tally per lane
    thread (no lock, no contention), summed into Prometheus families when
    scraped. prometheus-client's Counter and Histogram took five locks and
    a scan of the buckets per task."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _tallies
        self._tallies: list[_Tally] = []  # a finished thread's too: counters never go down

    def _tally(self) -> _Tally:
        tally = _Tally()
        self._local.tally = tally
        with self._lock:
            self._tallies.append(tally)
        return tally

    def add(
        self, process: str, outcome: str, seconds: float | None, wait: dt.timedelta | None
    ) -> None:
        try:
            tally: _Tally = self._local.tally
        except AttributeError:
            tally = self._tally()
        key = (process, outcome)
        tally.counts[key] = tally.counts.get(key, 0) + 1
        if seconds is None:
            return
        figures = tally.seconds.get(process)
        if figures is None:
            empty = len(_SECONDS_BUCKETS) + 1
            figures = tally.seconds[process] = ([0] * empty, [0.0], [0] * empty, [_ZERO])
        figures[0][bisect_left(_SECONDS_BUCKETS, seconds)] += 1
        figures[1][0] += seconds
        if wait is not None:
            if wait < _ZERO:  # clocks: a claim cannot precede readiness
                wait = _ZERO
            figures[2][bisect_left(_WAIT_BUCKETS, wait)] += 1
            figures[3][0] += wait

    def _sums(self) -> tuple[dict[tuple[str, str], int], dict[str, _Histograms]]:
        # copies of another thread's dicts and lists are atomic under the
        # GIL; a scrape may miss the observation being added, no more
        with self._lock:
            tallies = list(self._tallies)
        counts: dict[tuple[str, str], int] = {}
        histograms: dict[str, _Histograms] = {}
        for tally in tallies:
            for key, n in dict(tally.counts).items():
                counts[key] = counts.get(key, 0) + n
            for process, figures in dict(tally.seconds).items():
                durations, duration_sum, waits, wait_sum = figures
                total = histograms.setdefault(process, _Histograms())
                total.add(0, list(durations), duration_sum[0])
                total.add(1, list(waits), wait_sum[0].total_seconds())
        return counts, histograms

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        counts, histograms = self._sums()
        tasks = CounterMetricFamily(
            "sqla_queue_tasks", "Task attempts by outcome", labels=["queue", "process", "outcome"]
        )
        for (process, outcome), n in sorted(counts.items()):
            tasks.add_metric([self.queue, process, outcome], n)
        yield tasks
        # prometheus-client's spelling of these bounds ("0.001", "1.0", "3600.0")
        bounds = [repr(float(b)) for b in _SECONDS_BUCKETS] + ["+Inf"]
        for index, (name, doc) in enumerate(
            (
                ("sqla_queue_task_duration_seconds", "How long a task's handler ran"),
                ("sqla_queue_task_wait_seconds", "From ready (data_hora) to claimed (started_at)"),
            )
        ):
            family = HistogramMetricFamily(name, doc, labels=["queue", "process"])
            for process, summed in sorted(histograms.items()):
                family.add_metric(
                    [self.queue, process],
                    list(zip(bounds, itertools.accumulate(summed.buckets[index]), strict=True)),
                    sum_value=summed.sums[index],
                )
            yield family

    def describe(self) -> Iterator[Any]:
        return iter(())


class _LaneCollector:
    """``sqla_queue_lanes`` and ``sqla_queue_lanes_busy``, read from the
    process's running workers when scraped."""

    def __init__(self, queue: str, prometheus: Any) -> None:
        self.queue = queue
        from prometheus_client.core import GaugeMetricFamily

        self.gauge = GaugeMetricFamily

    def collect(self) -> Iterator[Any]:
        from ..worker.runner import lanes_of

        lanes, busy = lanes_of(self.queue)
        total = self.gauge("sqla_queue_lanes", "Lanes of this process's workers", labels=["queue"])
        total.add_metric([self.queue], lanes)
        yield total
        running = self.gauge("sqla_queue_lanes_busy", "Lanes running a batch now", labels=["queue"])
        running.add_metric([self.queue], busy)
        yield running

    def describe(self) -> Iterator[Any]:
        return iter(())


class TaskStates:
    """``sqla_queue_tasks_in_state``: the queue's tasks per state, as ``status``
    counts them (``read``: the totals, state -> count), read when scraped
    but at most once every ``every`` seconds (a scrape in between gets the
    last read). A failed read is logged and the scrape goes on without the
    gauge: the worker's own metrics never wait for it."""

    def __init__(
        self,
        queue: str,
        read: Callable[[], dict[str, int]],
        *,
        every: float = TASK_STATES_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from prometheus_client.core import GaugeMetricFamily

        self.queue, self._read, self._every, self._clock = queue, read, every, clock
        self._gauge = GaugeMetricFamily
        self._lock = threading.Lock()
        self._last: dict[str, int] | None = None
        self._read_at: float | None = None

    def counts(self) -> dict[str, int] | None:
        """The counts, read again if the last read is ``every`` old."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._every:
                self._read_at = now
                try:
                    self._last = dict(self._read())
                except Exception as exc:  # the database away: the rest is served
                    logger.warning("metrics: tasks by state not read: %s", describe_error(exc))
                    self._last = None
            return self._last

    def collect(self) -> Iterator[Any]:
        counts = self.counts()
        if counts is None:
            return
        family = self._gauge(
            "sqla_queue_tasks_in_state",
            "Tasks (chains) by state, as status counts them",
            labels=["queue", "state"],
        )
        for state, n in counts.items():
            family.add_metric([self.queue, state], n)
        yield family

    def describe(self) -> Iterator[Any]:
        return iter(())


def serve(
    port: int,
    *,
    host: str = "127.0.0.1",
    queue: str,
    registry: Any = None,
    processes: Collection[str] | None = None,
    states: Callable[[], dict[str, int]] | None = None,
) -> QueueMetrics:
    """Attach a queue's metrics to the process's hooks and serve them as
    Prometheus text on ``http://host:port/metrics``, from a daemon thread
    (``processes``: the worker's, see :class:`QueueMetrics`; ``states``:
    reads the tasks per state for ``sqla_queue_tasks_in_state``, see :class:`TaskStates`)."""
    prometheus = _prometheus()
    metrics = QueueMetrics(queue, registry=registry, processes=processes).attach()
    if states is not None:
        metrics.registry.register(TaskStates(queue, states))
    prometheus.start_http_server(port, addr=host, registry=metrics.registry)
    return metrics
