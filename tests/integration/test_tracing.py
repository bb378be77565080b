"""OpenTelemetry (sqla_queue.ops.tracing): the trace context stored at enqueue,
one span per task in the worker, a child of the span that enqueued it."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from sqla_queue import QueueApp, QueueClient, Runner, WorkerBase, tracing
from sqla_queue.config.settings import Settings
from tests.conftest import run_cli
from tests.support.app import App


@pytest.fixture
def spans() -> Iterator[tuple[Any, InMemorySpanExporter]]:
    """A tracer of the test's own and the exporter the worker's spans reach;
    sqla-queue instrumented with that provider while the test runs."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(tracer_provider=provider)
    try:
        yield provider.get_tracer("tests"), exporter
    finally:
        tracing.uninstrument()
        provider.shutdown()


def _enqueue_orm(engine: Engine, app: App, payload: Any) -> int:
    with Session(engine) as session, session.begin():
        task = app.Task(payload=payload, process="faturar")
        session.add(task)
        session.flush()
        return int(task.id)


def _stored(engine: Engine, app: App) -> dict[int, Any]:
    with engine.connect() as conn:
        rows = conn.execute(select(app.Task.id, app.Task.trace_context)).all()
    return {row.id: row.trace_context for row in rows}


def _task_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    found = exporter.get_finished_spans()
    return [
        s for s in found if s.instrumentation_scope and s.instrumentation_scope.name == "sqla_queue"
    ]


def test_each_task_runs_in_a_child_of_the_span_that_enqueued_it(
    engine: Engine, app: App, installed: None, spans: tuple[Any, InMemorySpanExporter]
) -> None:
    tracer, exporter = spans

    class Billing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 2

    with tracer.start_as_current_span("checkout") as checkout:
        by_orm = _enqueue_orm(engine, app, {"n": 1})
        # a failure whose text holds a secret: the span says why, masked
        failing = _enqueue_orm(engine, app, {"fail": "password=hunter2"})
    with tracer.start_as_current_span("import") as imported, engine.begin() as conn:
        by_client = QueueClient(conn, app.Task).insert_task(None, None, "faturar", None, {"n": 2})
        [by_bulk] = QueueClient(conn, app.Task).insert_tasks([{"processo": "faturar"}])
    untraced = _enqueue_orm(engine, app, {"n": 3})  # outside any span
    with tracer.start_as_current_span("garbage"):
        garbage = _enqueue_orm(engine, app, {"n": 4})
    with engine.begin() as conn:  # not a context tracing wrote: ignored, never an error
        conn.execute(
            update(app.Task).where(app.Task.id == garbage).values(trace_context="{not json")
        )

    stored = _stored(engine, app)
    assert stored[untraced] is None
    for task_id, span in [(by_orm, checkout), (by_client, imported), (by_bulk, imported)]:
        carrier = json.loads(stored[task_id])
        trace_id, span_id = (
            f"{span.get_span_context().trace_id:032x}",
            f"{span.get_span_context().span_id:016x}",
        )
        assert carrier["traceparent"].startswith(f"00-{trace_id}-{span_id}-")

    parts = QueueApp(Billing(), engine=engine, settings=Settings())
    assert Runner(parts, burst=True).run() == 0

    with engine.connect() as conn:
        rows = conn.execute(
            select(
                app.Task.id,
                app.Task.initial_id.label("initial_id"),
                app.Task.dead,
                app.Task.live_id,
            )
        ).all()
    by_id = {s.attributes["messaging.message.id"]: s for s in _task_spans(exporter)}
    assert set(by_id) == {str(row.id) for row in rows}  # every attempt ran in a span

    def parent_of(task_id: int) -> ReadableSpan:
        return by_id[str(task_id)]

    for task_id, span in [(by_orm, checkout), (by_client, imported), (by_bulk, imported)]:
        run = parent_of(task_id)
        assert run.kind == SpanKind.CONSUMER
        assert run.parent is not None and run.parent.span_id == span.get_span_context().span_id
        assert run.context.trace_id == span.get_span_context().trace_id
        assert [link.context.span_id for link in run.links] == [span.get_span_context().span_id]
        assert run.status.status_code == StatusCode.UNSET
        assert run.name == "run faturar"
        assert run.attributes["messaging.destination.name"] == app.Task.__table__.name
        assert run.attributes["sqla_queue.chain_id"] == task_id
        assert run.attributes["sqla_queue.attempt"] == 1
    for task_id in (untraced, garbage):  # a root span of a trace of its own
        run = parent_of(task_id)
        assert run.parent is None and not run.links
        assert run.context.trace_id not in {
            checkout.get_span_context().trace_id,
            imported.get_span_context().trace_id,
        }

    # the failing chain: both attempts and the dead-letter run in the checkout's trace
    chain = [row for row in rows if row.id == failing or row.initial_id == failing]
    dead_run = [row for row in rows if row.dead and row.live_id == failing]
    assert len(chain) == 2 and len(dead_run) == 1
    for row in chain:
        run = parent_of(row.id)
        assert run.context.trace_id == checkout.get_span_context().trace_id
        assert run.status.status_code == StatusCode.ERROR
        assert "asked to fail" in (run.status.description or "")
        everything = json.dumps(
            [run.status.description, [dict(e.attributes or {}) for e in run.events]]
        )
        assert "hunter2" not in everything
    assert parent_of(chain[1].id).attributes["sqla_queue.attempt"] == 2
    dead = parent_of(dead_run[0].id)
    assert dead.context.trace_id == checkout.get_span_context().trace_id
    assert dead.attributes["sqla_queue.dead"] is True
    assert dead.status.status_code == StatusCode.UNSET


def test_nothing_is_stored_or_traced_when_not_instrumented(
    engine: Engine, app: App, installed: None
) -> None:
    from opentelemetry.sdk.trace import TracerProvider as Provider

    tracer = Provider().get_tracer("tests")
    assert not tracing.instrumented()
    with tracer.start_as_current_span("checkout"):
        task_id = _enqueue_orm(engine, app, {"n": 1})
    assert _stored(engine, app) == {task_id: None}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_worker_command_traces_with_tracing(
    engine: Engine,
    app: App,
    installed: None,
    db_url: str,
    tmp_path: Path,
    spans: tuple[Any, InMemorySpanExporter],
) -> None:
    """``sqla-queue worker --tracing``: the worker module configures the SDK
    (tests/support/traced_app.py writes its spans to a file)."""
    tracer, _ = spans
    with tracer.start_as_current_span("checkout") as checkout:
        task_id = _enqueue_orm(engine, app, {"n": 1})
    out = tmp_path / "spans.jsonl"
    env = {"SQLA_QUEUE_TEST_TABLE": app.Task.__table__.name, "SQLA_QUEUE_TEST_SPANS": str(out)}
    worker = "tests.support.traced_app:RecordingWorker"
    run_cli("worker", worker, "--url", db_url, "--burst", env=env)
    assert not out.exists()  # without --tracing: no span
    with engine.begin() as conn:
        conn.execute(update(app.Task).values(status="pendente"))
    run_cli("worker", worker, "--url", db_url, "--burst", env={**env, "SQLA_QUEUE_TRACING": "true"})
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["scope"] == "sqla_queue"
    assert record["trace_id"] == f"{checkout.get_span_context().trace_id:032x}"
    assert record["parent_span_id"] == f"{checkout.get_span_context().span_id:016x}"
    assert record["attributes"]["messaging.message.id"] == str(task_id)
    assert os.environ.get("SQLA_QUEUE_TRACING") is None


def test_pubsub_copies_run_in_the_trace_of_their_publication(
    pengine: Engine, papp: Any, spans: tuple[Any, InMemorySpanExporter]
) -> None:
    from tests.integration.test_pubsub import add_subscribers, publish, rows
    from tests.integration.test_worker import drain

    tracer, exporter = spans
    add_subscribers(pengine, papp, {"id": "ok", "process": "pedido"})
    with tracer.start_as_current_span("order") as order:
        publication = publish(pengine, papp, {"pedido": 1})
    drain(papp.PubSubWorker, pengine)

    copies = [t.id for t in rows(pengine, papp) if t.publication_id == publication]
    assert len(copies) == 1
    by_id = {s.attributes["messaging.message.id"]: s for s in _task_spans(exporter)}
    for task_id in [publication, *copies]:
        run = by_id[str(task_id)]
        assert run.context.trace_id == order.get_span_context().trace_id
        assert run.parent is not None and run.parent.span_id == order.get_span_context().span_id


def test_an_async_handlers_spans_are_children_of_its_task_span(
    engine: Engine, app: App, installed: None, spans: tuple[Any, InMemorySpanExporter]
) -> None:
    """The handler's coroutine runs in the lane's context: a span it starts
    is a child of the task's span, and the trace is the enqueuer's."""
    tracer, exporter = spans

    class Notify(WorkerBase):
        model = app.Task

        async def execute(self, payload: Any, task: Any, session: Any) -> None:
            with tracer.start_as_current_span(f"inner {task.id}"):
                await asyncio.sleep(0)

    with tracer.start_as_current_span("checkout") as checkout:
        first = _enqueue_orm(engine, app, {"n": 1})
    second = _enqueue_orm(engine, app, {"n": 2})
    assert Notify().run(engine=engine, burst=True, settings=Settings(), concurrency=2) == 0

    runs = {s.attributes["messaging.message.id"]: s for s in _task_spans(exporter)}
    inner = {s.name: s for s in exporter.get_finished_spans() if s.name.startswith("inner")}
    for task_id in (first, second):
        run, child = runs[str(task_id)], inner[f"inner {task_id}"]
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    assert runs[str(first)].context.trace_id == checkout.get_span_context().trace_id
