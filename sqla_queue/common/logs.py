"""Log output of the ``sqla-queue`` commands: text or JSON lines, and the
seed's Grafana Loki integration (``GRAFANA_URL``, ``ENV``).

JSON (``--log-format json``, ``SQLA_QUEUE_LOG_FORMAT=json``): one object a
line, with ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
``worker`` (this process's worker id, once it has one) and, on the lines
about a task, ``task_id`` (the attempt's id), ``chain_id``, ``attempt``,
``process``, ``dead`` (a dead-letter run's) and ``duration_ms`` where the
handler ran; ``exception`` holds a traceback when the line has one. The
messages are the text lines' (passwords and tokens already masked).

A log line may quote what a server answered or a task stored (a webhook's
response body, a task's message): its control characters never reach the
terminal or the file as they are. Text lines escape them visibly
(``\\x1b``, ``\\u202e``; a newline in a message too, so one record is
one line; a traceback keeps its lines); JSON lines write them as JSON
escapes (``\\u009b``: the same JSON values). See redaction.escape_controls.

Grafana Loki, as nsj-queue-lib does: when ``GRAFANA_URL`` is set (the push
endpoint, ``https://loki.example/loki/api/v1/push``), every log line is
also pushed there, labelled ``{ENV}_flask_api_skeleton=<env>_log`` (the
reference's label, ``ENV`` upper-cased, default ``DEV``) and
``application=sqla_queue``. Lines are sent in batches from a thread of
their own: a slow or unreachable Loki never holds up a worker (at most
10,000 lines wait; beyond that new ones are dropped, and a failed push is
said once on stderr, without the URL's credentials).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import sys
import threading
from typing import Any

from .redaction import describe_error, escape_controls, escape_json_line, redact

__all__ = [
    "TASK_FIELDS",
    "JsonFormatter",
    "LokiHandler",
    "TextFormatter",
    "configure",
    "set_worker_id",
    "task_fields",
]

#: the ``extra`` key that carries a task's fields on a log record
TASK_FIELDS = "sqla_queue_task"
_worker_id: str | None = None


def set_worker_id(worker_id: str | None) -> None:
    """The worker id JSON lines carry (set by the runner at start)."""
    global _worker_id
    _worker_id = worker_id


def task_fields(task: Any, seconds: float | None = None) -> dict[str, Any]:
    """``extra=`` for a log line about ``task`` (a TaskRecord)."""
    fields = {
        "task_id": task.id,
        "chain_id": task.chain_id,
        "attempt": task.attempt,
        "process": task.process,
        "dead": bool(task.dead),
    }
    if seconds is not None:
        fields["duration_ms"] = round(seconds * 1000, 3)
    return {TASK_FIELDS: fields}


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if _worker_id is not None:
            data["worker"] = _worker_id
        fields = getattr(record, TASK_FIELDS, None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            data["exception"] = redact(self.formatException(record.exc_info))
        return escape_json_line(json.dumps(data, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """A text line a terminal shows as it is: the control characters of
    the message escaped, newlines too (one record, one line); a traceback's
    lines stay lines, their control characters escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return escape_controls(super().formatException(ei), multiline=True)

    def formatStack(self, stack_info: str) -> str:
        return escape_controls(super().formatStack(stack_info), multiline=True)


class LokiHandler(logging.Handler):
    """Pushes log lines to a Grafana Loki push endpoint from a thread of
    its own, in batches (see the module)."""

    def __init__(
        self,
        url: str,
        labels: dict[str, str],
        *,
        batch: int = 500,
        interval: float = 1.0,
        capacity: int = 10_000,
        timeout: float = 5.0,
    ) -> None:
        super().__init__()
        self.url = url
        self.labels = dict(labels)
        self.batch = batch
        self.interval = interval
        self.timeout = timeout
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue(capacity)
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="sqla-queue-loki", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            self._lines.put_nowait((str(int(record.created * 1e9)), line))
        except queue.Full:
            pass  # Loki is behind: this line is dropped, the worker goes on
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + self.interval + 1)
        super().close()

    def _run(self) -> None:
        import requests

        with requests.Session() as http:
            while True:
                stopping = self._stop.wait(self.interval)
                while True:
                    values = self._take()
                    if not values:
                        break
                    self._push(http, values)
                if stopping:
                    return

    def _take(self) -> list[tuple[str, str]]:
        values: list[tuple[str, str]] = []
        while len(values) < self.batch:
            try:
                values.append(self._lines.get_nowait())
            except queue.Empty:
                break
        return values

    def _push(self, http: Any, values: list[tuple[str, str]]) -> None:
        body = {"streams": [{"stream": self.labels, "values": [list(v) for v in values]}]}
        try:
            response = http.post(self.url, json=body, timeout=self.timeout)
            response.raise_for_status()
        except Exception as exc:
            if not self._warned:
                self._warned = True
                # never through logging (it would come back here), never the URL
                print(
                    "sqla-queue: pushing logs to GRAFANA_URL failed: "
                    f"{escape_controls(describe_error(exc))} "
                    "(lines are dropped until it answers; said once)",
                    file=sys.stderr,
                )


def configure(
    level: str, *, log_format: str = "text", grafana_url: str | None = None, env: str = "DEV"
) -> None:
    """The commands' logging: ``level``, text or JSON lines on stderr, and
    the Loki handler when ``grafana_url`` is given."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handlers: list[logging.Handler] = [handler]
    if grafana_url:
        env = (env or "DEV").upper()
        loki = LokiHandler(
            grafana_url,
            {f"{env}_flask_api_skeleton": f"{env.lower()}_log", "application": "sqla_queue"},
        )
        loki.setFormatter(JsonFormatter())
        handlers.append(loki)
    logging.basicConfig(level=level.upper(), handlers=handlers, force=True)
