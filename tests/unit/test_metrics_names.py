"""The Grafana dashboard and the docs name only metrics the worker serves."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sqla_queue.common.types import utcnow
from sqla_queue.ops.metrics import QueueMetrics, TaskStates
from sqla_queue.policies.hooks import TASK_FAILED, TASK_SUCCEEDED, Hooks, TaskEvent
from sqla_queue.schema.records import TaskRecord

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _record(process: str = "p", waited: float = 0.25) -> TaskRecord:
    started = utcnow()
    return TaskRecord(
        id=1, process=process, run_at=started - dt.timedelta(seconds=waited), started_at=started
    )


def served(families: bool = False) -> set[str]:
    """The sample names served (``families``: the names the docs give:
    a counter's ``_total``, a histogram's own)."""
    registry = CollectorRegistry()
    metrics = QueueMetrics("fila", registry=registry)
    # one sample of each labelled family, so that every name is listed
    hooks = Hooks()
    metrics.attach(hooks)
    hooks.emit([TaskEvent(TASK_SUCCEEDED, _record(), None, 0.1)])
    metrics.batch.labels("fila").observe(1)
    metrics.routines.labels("fila", "rescue", "ok").inc()
    metrics.reconnects.labels("fila").inc()
    # what serve() adds for sqla-queue worker --metrics-port
    registry.register(TaskStates("fila", lambda: {"ready": 1}))
    if families:
        return {
            f"{family.name}_total" if family.type == "counter" else family.name
            for family in registry.collect()
        }
    return {sample.name for family in registry.collect() for sample in family.samples}


def test_the_grafana_dashboard_queries_only_served_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for expr in expressions for name in re.findall(r"sqla_queue_\w+", expr)}
    assert named and named <= served()


def test_the_docs_table_lists_every_served_family() -> None:
    text = (DOCS / "operations.md").read_text()
    listed = set(re.findall(r"^\| `(sqla_queue_\w+)`", text, re.MULTILINE))
    assert listed == served(families=True)


def test_task_figures_read_as_prometheus_clients_own_would() -> None:
    """The per-task figures are counted by sqla-queue, not by
    prometheus-client's Counter and Histogram: the samples must be theirs."""
    ours = CollectorRegistry()
    hooks = Hooks()
    QueueMetrics("fila", registry=ours).attach(hooks)
    theirs = CollectorRegistry()
    from prometheus_client import Counter, Histogram

    from sqla_queue.ops.metrics import _SECONDS_BUCKETS

    tasks = Counter("sqla_queue_tasks", "", ["queue", "process", "outcome"], registry=theirs)
    histograms = [
        Histogram(name, "", ["queue", "process"], buckets=_SECONDS_BUCKETS, registry=theirs)
        for name in ("sqla_queue_task_duration_seconds", "sqla_queue_task_wait_seconds")
    ]
    # on a bound, between bounds, past the last, zero; two processes, two outcomes
    for process, event, seconds, waited in [
        ("a", TASK_SUCCEEDED, 0.001, 0.0),
        ("a", TASK_SUCCEEDED, 0.0031, 1.0),
        ("a", TASK_FAILED, 7200.0, 0.5),
        ("b", TASK_SUCCEEDED, 0.0, 3600.0),
    ]:
        hooks.emit([TaskEvent(event, _record(process, waited), None, seconds)])
        tasks.labels("fila", process, "failed" if event == TASK_FAILED else "succeeded").inc()
        histograms[0].labels("fila", process).observe(seconds)
        histograms[1].labels("fila", process).observe(waited)
    hooks.emit([TaskEvent(TASK_SUCCEEDED, _record("c"))])  # did not run here: counted only
    tasks.labels("fila", "c", "succeeded").inc()

    def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[Any, ...]], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in registry.collect()
            if family.name.startswith(("sqla_queue_tasks", "sqla_queue_task_"))
            for sample in family.samples
            if not sample.name.endswith("_created")
        }

    expected = samples(theirs)
    got = samples(ours)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


def test_lanes_counting_at_once_lose_no_task_and_a_finished_lane_still_counts() -> None:
    registry = CollectorRegistry()
    hooks = Hooks()
    QueueMetrics("fila", registry=registry).attach(hooks)
    start = threading.Barrier(4)

    def lane() -> None:
        start.wait()
        for _ in range(5_000):
            hooks.emit([TaskEvent(TASK_SUCCEEDED, _record(), None, 0.002)])

    threads = [threading.Thread(target=lane) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # every lane has ended: its tally stays
    labels = {"queue": "fila", "process": "p"}
    assert (
        registry.get_sample_value("sqla_queue_tasks_total", {**labels, "outcome": "succeeded"})
        == 20_000
    )
    assert registry.get_sample_value("sqla_queue_task_duration_seconds_count", labels) == 20_000
    assert registry.get_sample_value(
        "sqla_queue_task_duration_seconds_sum", labels
    ) == pytest.approx(40.0)
    assert (
        registry.get_sample_value("sqla_queue_task_wait_seconds_bucket", {**labels, "le": "0.25"})
        == 20_000
    )


def _process_labels(metrics: QueueMetrics, *processes: str) -> dict[str, float]:
    """Emit one success per process name; {process label: tasks counted}."""
    hooks = Hooks()
    metrics.attach(hooks)
    for process in processes:
        hooks.emit([TaskEvent(TASK_SUCCEEDED, _record(process), None, 0.01)])
    return {
        sample.labels["process"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "sqla_queue_tasks"
        for sample in family.samples
        if sample.name == "sqla_queue_tasks_total"
    }


def test_a_worker_with_processes_labels_only_those_and_the_rest_other() -> None:
    metrics = QueueMetrics("fila", registry=CollectorRegistry(), processes={"faturar", "notificar"})
    labels = _process_labels(metrics, "faturar", "estranho", "faturar", "outro\n", "notificar")
    assert labels == {"faturar": 2.0, "notificar": 1.0, "other": 2.0}


def test_a_worker_without_processes_labels_the_first_ones_seen_cut_and_escaped() -> None:
    from sqla_queue.ops.metrics import PROCESS_LABEL_MAX_CHARS

    metrics = QueueMetrics("fila", registry=CollectorRegistry(), most_processes=3)
    long = "a" * 300
    labels = _process_labels(metrics, "um", 'do"is\n\x1b[2J', long, long + "b", "quatro", "um")
    # the cut name and its longer twin are one label; the fourth distinct one is other
    assert labels == {
        "um": 2.0,
        'do"is\\x0a\\x1b[2J': 1.0,
        "a" * PROCESS_LABEL_MAX_CHARS: 2.0,
        "other": 1.0,
    }


def test_a_negative_cap_is_refused() -> None:
    from sqla_queue.common.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="most_processes must be 0 or more"):
        QueueMetrics("fila", registry=CollectorRegistry(), most_processes=-1)
