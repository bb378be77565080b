"""The Grafana dashboard and the docs name only metrics the worker serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from sqla_queue.metrics import QueueMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"


def served(families: bool = False) -> set[str]:
    """The sample names served (``families``: the names the docs give:
    a counter's ``_total``, a histogram's own)."""
    registry = CollectorRegistry()
    metrics = QueueMetrics("fila", registry=registry)
    # one sample of each labelled family, so that every name is listed
    metrics.tasks.labels("fila", "p", "succeeded").inc()
    metrics.duration.labels("fila", "p").observe(0.1)
    metrics.wait.labels("fila", "p").observe(0.1)
    metrics.batch.labels("fila").observe(1)
    metrics.routines.labels("fila", "rescue", "ok").inc()
    metrics.reconnects.labels("fila").inc()
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
