"""The worker command's logs: JSON lines with the task's fields, and the
seed's Grafana Loki push (GRAFANA_URL, ENV) to a real HTTP server."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine

from tests.integration.test_worker import enqueue
from tests.support.app import App

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def burst(db_url: str, table: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "sqla_queue.cli", "worker", "tests.support.app:RecordingWorker",
            "--url", db_url, "--burst", *args,
        ],
        env={**os.environ, "SQLA_QUEUE_TEST_TABLE": table, "PYTHONPATH": REPO,
             "QUEUE_MAX_RETRY": "2", **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


@sqlite_only
def test_json_lines_carry_the_task_and_the_worker(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    [ok] = enqueue(engine, app, {"n": 1})
    [bad] = enqueue(engine, app, {"fail": "x"})
    done = burst(db_url, app.Task.__tablename__, "--log-format", "json", "--log-level", "INFO")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    about = [line for line in lines if "task_id" in line]
    succeeded = next(line for line in about if line["task_id"] == ok)
    assert succeeded["chain_id"] == ok and succeeded["attempt"] == 1
    assert succeeded["process"] == "faturar" and succeeded["duration_ms"] >= 0
    assert succeeded["worker"].count(":") == 2  # host:pid:random
    failed = [line for line in about if line["chain_id"] == bad and line["level"] == "WARNING"]
    assert {line["attempt"] for line in failed} == {1, 2}
    assert any("asked to fail" in line["message"] for line in failed)


class Loki(BaseHTTPRequestHandler):
    pushes: ClassVar[list[tuple[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Loki.pushes.append((self.path, json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def loki() -> Iterator[int]:
    Loki.pushes = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Loki)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@sqlite_only
def test_grafana_url_receives_every_line_labelled_with_env(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    [bad] = enqueue(engine, app, {"fail": "x"})
    with loki() as port:
        url = f"http://loki:pushpassword@127.0.0.1:{port}/loki/api/v1/push"
        done = burst(db_url, app.Task.__tablename__, GRAFANA_URL=url, ENV="prod")
    assert done.returncode == 0, done.stderr
    assert "pushpassword" not in done.stderr
    assert Loki.pushes, "nothing pushed"
    streams = [stream for _, body in Loki.pushes for stream in body["streams"]]
    assert {path for path, _ in Loki.pushes} == {"/loki/api/v1/push"}
    assert all(
        s["stream"] == {"PROD_flask_api_skeleton": "prod_log", "application": "sqla_queue"}
        for s in streams
    )
    pushed = [json.loads(line) for s in streams for _, line in s["values"]]
    # the same lines as stderr: the worker's start, the failures, its stop
    assert any(
        line.get("chain_id") == bad and "asked to fail" in line["message"] for line in pushed
    )
    assert any("stopped" in line["message"] for line in pushed)
    assert all(isinstance(int(ts), int) for s in streams for ts, _ in s["values"])


@sqlite_only
def test_an_unreachable_grafana_url_never_stops_the_worker(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    enqueue(engine, app, *({"n": n} for n in range(5)))
    with loki() as port:
        pass  # the port is closed again: nothing listens there
    url = f"http://loki:pushpassword@127.0.0.1:{port}/loki/api/v1/push"
    done = burst(db_url, app.Task.__tablename__, GRAFANA_URL=url)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("pushing logs to GRAFANA_URL failed") == 1
    assert "pushpassword" not in done.stderr
    with engine.connect() as conn:
        from sqlalchemy import func, select

        left = conn.execute(
            select(func.count()).select_from(app.Task).where(app.Task.status != "sucesso")
        ).scalar_one()
    assert left == 0


@sqlite_only
def test_a_task_message_with_control_characters_is_escaped_in_every_log_line(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    """The handler's error (stored in mensagem, quoted by the log line of the
    failure) holds ESC sequences, BEL, C1, bidi overrides: text lines show
    them escaped, JSON lines as JSON escapes that decode to the same text."""
    from tests.integration.test_inspect import HOSTILE, raw_controls

    enqueue(engine, app, {"fail": HOSTILE})
    text = burst(db_url, app.Task.__tablename__, "--log-level", "INFO")
    assert text.returncode == 0, text.stderr
    assert raw_controls(text.stderr) == []
    failed = [line for line in text.stderr.splitlines() if "asked to fail" in line]
    assert failed and all("\\x1b]0;pwned\\x07" in line for line in failed)
    assert all("\\u202eevil\\u202c" in line and "\\x9b31m" in line for line in failed)

    [again] = enqueue(engine, app, {"fail": HOSTILE})
    lines = burst(db_url, app.Task.__tablename__, "--log-format", "json", "--log-level", "INFO")
    assert lines.returncode == 0, lines.stderr
    assert raw_controls(lines.stderr) == []
    about = [json.loads(line) for line in lines.stderr.splitlines() if line.strip()]
    messages = [line["message"] for line in about if line.get("chain_id") == again]
    assert any(f"asked to fail: {HOSTILE}" in message for message in messages), messages


def test_a_listen_connection_that_keeps_failing_warns_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the database is away the listener retries, further and further
    apart, and says so once, on one line, below the lanes' warnings, which
    say it already (two "LISTEN failed" warnings a second before)."""
    from sqlalchemy import create_engine

    from sqla_queue.adapters.postgresql import PostgresListener
    from sqla_queue.worker.wakeup import LaneWakeup
    from tests.conftest import wait_until
    from tests.support.servers import free_port

    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test")
    listener = PostgresListener(engine, "nobody_listens")
    caplog.set_level("DEBUG", logger="sqla_queue")

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "LISTEN nobody_listens failed" in r.getMessage()]

    listener.start(LaneWakeup())
    try:
        wait_until(lambda: len(failures()) >= 2, 30, message="two failed attempts")
    finally:
        listener.stop()
        engine.dispose()
    assert [r.levelname for r in failures()][:2] == ["INFO", "DEBUG"]
    assert "\n" not in failures()[0].getMessage()
