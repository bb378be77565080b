"""OpenTelemetry: one span per task, a child of the trace that enqueued it.

    pip install 'sqla-queue[otel]'

    from sqla_queue import tracing
    tracing.instrument()      # in the application that enqueues, and in the worker

or ``sqla-queue worker MODULE:CLASS --tracing`` (``SQLA_QUEUE_TRACING=true``).

Instrumented, a process does two things:

- **At enqueue** (``session.add(Task(...))`` and ``QueueClient``'s inserts),
  the current span's W3C trace context (``traceparent``, and ``tracestate``
  when there is one) is stored with the task, as JSON, in the
  ``trace_context`` column. Outside a span nothing is stored. Retries and
  the dead-letter run keep their task's context.
- **In the worker**, each handler call runs in a span (kind ``CONSUMER``,
  named ``run PROCESS``) whose parent is the stored context, with a link to
  it as well; a task enqueued outside any trace gets a span of its own
  trace. Attributes: ``messaging.system`` (``sqla_queue``),
  ``messaging.destination.name`` (the queue table), ``messaging.operation.type``
  (``process``), ``messaging.message.id`` (the attempt's id),
  ``sqla_queue.chain_id``, ``sqla_queue.attempt``, ``sqla_queue.process``,
  ``sqla_queue.tenant`` (when set) and ``sqla_queue.dead`` (a dead-letter
  run). A handler that raises sets the span's status to ERROR with the
  error's one-line description, masked as the logs are (``redaction.py``):
  the exception's text is not recorded raw, as it may hold secrets.

The spans go to the global tracer provider unless one is given: configure
the OpenTelemetry SDK (an exporter) in your own code, for a worker in the
module the CLI loads, or run it under ``opentelemetry-instrument``. Without
an SDK the API's spans cost next to nothing and go nowhere.

A span covers the handler's run inside the batch's transaction; whether the
attempt then commits as ``sucesso`` is the metrics' and the hooks' to say
(a batch rolled back after the span ended leaves a span with status OK).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from ..common import stamps
from ..common.exceptions import ConfigurationError
from ..common.redaction import describe_error
from ..policies.pipeline import Handler, Middleware, register_middleware, unregister_middleware
from ..schema.records import TaskRecord

__all__ = ["TRACE_CONTEXT_MAX_LENGTH", "TaskSpans", "instrument", "instrumented", "uninstrument"]

#: a stored context longer than this loses its tracestate (a traceparent is 55 characters)
TRACE_CONTEXT_MAX_LENGTH = 1024
_INSTRUMENTATION = "sqla_queue"

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

_state: dict[str, Any] = {}


def _api() -> None:
    if trace is None:
        raise ConfigurationError(
            "tracing needs OpenTelemetry's API: pip install 'sqla-queue[otel]'"
        )


def instrument(tracer_provider: Any = None) -> None:
    """Store the trace context at enqueue and run every task in a span, in
    this process (idempotent; ``tracer_provider``: else the global one)."""
    _api()
    uninstrument()
    propagator = TraceContextTextMapPropagator()
    tracer = trace.get_tracer(_INSTRUMENTATION, tracer_provider=tracer_provider)

    def stamp() -> Mapping[str, Any]:
        stored = encode_context(propagator)
        return {} if stored is None else {"trace_context": stored}

    def spans(queue: str) -> Middleware:
        return TaskSpans(queue, tracer, propagator)

    _state.update(stamp=stamp, spans=spans)
    stamps.register(stamp)
    register_middleware(spans)


def uninstrument() -> None:
    """Undo :func:`instrument` (workers built before keep their spans)."""
    if "stamp" in _state:
        stamps.unregister(_state.pop("stamp"))
        unregister_middleware(_state.pop("spans"))


def instrumented() -> bool:
    return "stamp" in _state


def encode_context(propagator: Any) -> str | None:
    """The current span's W3C trace context as stored (JSON), or None
    outside a valid span."""
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    if "traceparent" not in carrier:
        return None
    text = json.dumps(carrier, separators=(",", ":"), sort_keys=True)
    if len(text) > TRACE_CONTEXT_MAX_LENGTH:
        text = json.dumps({"traceparent": carrier["traceparent"]}, separators=(",", ":"))
    return text


def decode_context(propagator: Any, stored: str | None) -> Any:
    """The context a stored ``trace_context`` names, or None (absent, or
    not a context this module wrote: such text is ignored, never an error)."""
    if not stored:
        return None
    try:
        carrier = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(carrier, dict) or not all(isinstance(v, str) for v in carrier.values()):
        return None
    context = propagator.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


class TaskSpans:
    """The middleware: each handler call in a span (see the module)."""

    def __init__(self, queue: str, tracer: Any, propagator: Any) -> None:
        self.queue = queue
        self.tracer = tracer
        self.propagator = propagator

    def wrap(self, handler: Handler, conn: Connection) -> Handler:
        def traced(task: TaskRecord, session: Session) -> Any:
            parent = decode_context(self.propagator, task.trace_context)
            links = []
            if parent is None:
                parent = otel_context.Context()  # a root: not the lane's context
            else:
                links.append(Link(trace.get_current_span(parent).get_span_context()))
            with self.tracer.start_as_current_span(
                f"run {task.process or self.queue}",
                context=parent,
                kind=SpanKind.CONSUMER,
                links=links,
                attributes=self._attributes(task),
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    return handler(task, session)
                except BaseException as exc:
                    message = describe_error(exc)
                    span.set_status(Status(StatusCode.ERROR, message))
                    span.add_event(
                        "exception",
                        {"exception.type": type(exc).__qualname__, "exception.message": message},
                    )
                    raise

        return traced

    def _attributes(self, task: TaskRecord) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "messaging.system": "sqla_queue",
            "messaging.destination.name": self.queue,
            "messaging.operation.type": "process",
            "messaging.message.id": str(task.id),
            "sqla_queue.chain_id": task.chain_id,
            "sqla_queue.attempt": task.attempt,
            "sqla_queue.process": task.process or "",
            "sqla_queue.dead": task.dead,
        }
        if task.tenant is not None:
            attributes["sqla_queue.tenant"] = task.tenant
        return attributes
