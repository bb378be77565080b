"""Wake-up latency and lock round trips: the queue server against PostgreSQL's own.

    python benchmarks/client_server.py [--url postgresql://postgres@127.0.0.1/test]
        [--n 2000] [--wakes 300] [--polled 30] [--json benchmarks/results/client_server.json]

Everything in one run, on one machine:

- locks: ``--n`` times take a routine lock and give it back, through the
  queue server (``lock`` + ``unlock``, two round trips on one connection) and
  through PostgreSQL (``pg_try_advisory_lock`` + ``pg_advisory_unlock`` on an
  autocommit connection, what the PostgreSQL adapter's ``lock_try`` and
  ``lock_release`` run);
- wake-ups: ``--wakes`` times, the time from a client's ``notify`` until an
  idle worker's wake event is set, through the server (``notify`` on the lock
  port, ``wake`` pushed to the worker's :class:`ServerWakeups`) and through
  PostgreSQL (``pg_notify`` committed, the worker's LISTEN thread);
- the server's polled wake-up: ``--polled`` times, the time from a task's
  INSERT commit until the wake, with CHECK_TASKS_INTERVAL=0.2 s (it looks at
  the queue on a timer, so this is about half the interval, by design).

The server is a real ``sqla-queue server`` process on free local ports;
medians and 95th percentiles in microseconds (milliseconds for the polled
wake-up). Loopback TCP on a shared machine: compare the rows, not the
absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sqla_queue import QueueClient, QueueMixin, normalize_url
from sqla_queue.adapters import adapter_for
from sqla_queue.config.settings import ServerSettings
from sqla_queue.server import ServerConnection, ServerRoutineLock, ServerWakeups

ROOT = Path(__file__).resolve().parent.parent
SECRET = "benchmark-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _summary(samples: list[float], scale: float) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered) * scale, 1),
        "p95": round(ordered[int(len(ordered) * 0.95) - 1] * scale, 1),
        "n": len(ordered),
    }


def _timed(n: int, step: Callable[[], None]) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        step()
        samples.append(time.perf_counter() - started)
    return samples


def _wake_latency(n: int, wake: threading.Event, fire: Callable[[], None]) -> list[float]:
    samples = []
    for _ in range(n):
        wake.clear()
        started = time.perf_counter()
        fire()
        if not wake.wait(10):
            raise RuntimeError("no wake-up within 10 s")
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--wakes", type=int, default=300)
    parser.add_argument("--polled", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    table_name = f"bench_cs_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table_name

    url = normalize_url(args.url)
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    settings = ServerSettings(
        enabled=True, notify_port=_free_port(), lock_port=_free_port(), secret=SECRET
    )
    env = {
        **os.environ,
        "SQLA_QUEUE_SERVER_SECRET": SECRET,
        "QUEUE_TABLE": table_name,
        "CHECK_TASKS_INTERVAL": "0.2",
    }
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "sqla_queue.cli", "server", "--url", str(args.url)),
            *("--notify-port", str(settings.notify_port)),
            *("--lock-port", str(settings.lock_port), "--log-level", "WARNING"),
        ],
        cwd=ROOT,
        env=env,
    )
    results: dict[str, Any] = {"n": args.n, "wakes": args.wakes}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                ServerConnection.open(settings, settings.lock_port, client_name="probe").close()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

        # ------------------------------------------------------------ locks
        routine = ServerRoutineLock(settings, client_name="bench")

        def server_lock() -> None:
            assert routine.try_acquire("bench")
            routine.release("bench")

        _timed(100, server_lock)  # warm-up
        results["lock_server_us"] = _summary(_timed(args.n, server_lock), 1e6)
        routine.close()

        adapter = adapter_for(engine.dialect, Task.__table__, table_name)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:

            def pg_lock() -> None:
                assert adapter.lock_try(conn, key=1)
                adapter.lock_release(conn, key=1)

            _timed(100, pg_lock)
            results["lock_postgresql_us"] = _summary(_timed(args.n, pg_lock), 1e6)

        # ------------------------------------------------------------ wake-ups
        wake = threading.Event()
        wakeups = ServerWakeups(settings, table_name, client_name="bench-worker")
        wakeups.start(wake)
        notifier = ServerConnection.open(settings, settings.lock_port, client_name="notifier")

        def server_notify() -> None:
            notifier.request("notify", queue=table_name)

        _wake_latency(20, wake, server_notify)
        results["wake_server_us"] = _summary(_wake_latency(args.wakes, wake, server_notify), 1e6)
        notifier.close()

        # the server's own look at the queue: INSERT committed -> wake
        def insert_task() -> None:
            with engine.begin() as conn:
                QueueClient(conn, Task).insert_task("b", "b", "bench", "k", "{}")

        polled = _wake_latency(args.polled, wake, insert_task)
        with engine.begin() as conn:
            conn.execute(text(f'DELETE FROM "{table_name}"'))
        results["wake_server_polled_ms"] = _summary(polled, 1e3)
        wakeups.stop()

        pg_wake = threading.Event()
        listener = adapter.listener(engine)
        listener.start(pg_wake)
        listener.listening.wait(10)  # type: ignore[attr-defined]
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:

            def pg_notify() -> None:
                adapter.notify(conn)

            _wake_latency(20, pg_wake, pg_notify)
            results["wake_postgresql_us"] = _summary(
                _wake_latency(args.wakes, pg_wake, pg_notify), 1e6
            )
        listener.stop()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        Base.metadata.drop_all(engine)
        engine.dispose()

    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
