"""Webhook deliveries per second against a local HTTP server.

    python benchmarks/webhooks.py [--n 2000] [--reps 3] [--delay 0]

A ThreadingHTTPServer on 127.0.0.1 answers every POST with 200 after
``--delay`` seconds (0: at once, which measures the client's own cost:
requests, the redirect and body handling, the message; 0.01 stands for a
receiver that takes 10 ms). One WebhookClient delivers ``--n`` signed
deliveries of a small JSON payload through ``deliver_many``, with
concurrency 1 and 8; the median of ``--reps`` runs, after a warm-up.
The server shares the machine (and Python's GIL-bound http.server), so the
numbers are a floor for the client, not a ceiling.

With ``--worker URL`` it also measures the whole webhook worker on that
database: one publication fanned out to ``--n`` subscriptions that all
point at the server, delivered by ``WorkerWebhook`` in burst mode (claim,
subscription read, calls outside the transaction, recorded outcomes),
with 1 and 2 lanes.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqla_queue.webhooks.delivery import Delivery, WebhookClient

DELAY = 0.0
# the server listens on 127.0.0.1: let it through the guard (on by default)
LOCAL = ("127.0.0.1/32",)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # http.server writes the headers and the body apart: with Nagle on, the
    # body waits for the client's delayed ACK (40 ms a response on Linux)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if DELAY:
            time.sleep(DELAY)
        body = b'{"received": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    global DELAY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument(
        "--worker", metavar="URL", help="also run the webhook worker on this database"
    )
    args = parser.parse_args()
    DELAY = args.delay

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    payload = '{"order": 1234, "status": "paid", "amount": "19.90"}'
    deliveries = [
        Delivery(
            url=url,
            http_method="POST",
            body=payload,
            delivery_id=f"d-{i}",
            headers={"Authorization": "Bearer benchmark-token"},
            signing_secret=secret,
        )
        for i in range(args.n)
    ]
    print(f"{args.n} deliveries, server delay {args.delay:g} s, median of {args.reps} runs")
    for concurrency in (1, 8):
        with WebhookClient(
            timeout=10, max_concurrency=concurrency, allowed_networks=LOCAL
        ) as client:
            client.deliver_many(deliveries[:50], concurrency)  # warm-up: connections
            rates = []
            for _ in range(args.reps):
                started = time.perf_counter()
                results = client.deliver_many(deliveries, concurrency)
                elapsed = time.perf_counter() - started
                assert all(r.ok for r in results), next(r for r in results if not r.ok)
                rates.append(args.n / elapsed)
        print(f"  concurrency {concurrency}: {statistics.median(rates):8.0f} deliveries/s")
    if args.worker:
        for lanes in (1, 2):
            rates = [worker_rate(args.worker, url, args.n, lanes) for _ in range(args.reps)]
            print(
                f"  worker, {lanes} lane(s), {args.worker.split(':')[0]}: "
                f"{statistics.median(rates):8.0f} deliveries/s (end to end)"
            )
    server.shutdown()
    server.server_close()


def worker_rate(db_url: str, hook_url: str, n: int, lanes: int) -> float:
    """Deliveries per second of WorkerWebhook for one publication to ``n``
    subscriptions, fan-out included."""
    import uuid

    from sqlalchemy import create_engine
    from sqlalchemy.orm import DeclarativeBase, Session

    from sqla_queue import QueueClient, QueueMixin, SubscriberMixin, WorkerWebhook
    from sqla_queue.config.settings import Settings

    table = f"bench_hook_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        pass

    class Task(QueueMixin, Base):
        __tablename__ = table

    class Subscriber(SubscriberMixin, Base):
        __tablename__ = f"{table}_sub"

    class Hooks(WorkerWebhook):
        model = Task
        subscriber_model = Subscriber

    engine = create_engine(db_url)
    Base.metadata.create_all(engine)
    try:
        with Session(engine) as session, session.begin():
            session.add_all(
                Subscriber(id=f"s{i}", process="evento", url=hook_url) for i in range(n)
            )
        with engine.begin() as conn:
            QueueClient(conn, Task).insert_task_pub_sub(
                process="evento", payload={"order": 1234, "status": "paid"}
            )
        os.environ["WEBHOOK_ALLOWED_NETWORKS"] = ",".join(LOCAL)
        started = time.perf_counter()
        Hooks().run(engine=engine, burst=True, concurrency=lanes, settings=Settings())
        elapsed = time.perf_counter() - started
        with engine.connect() as conn:
            from sqlalchemy import func, select

            done = conn.execute(
                select(func.count()).where(
                    Task.status == "sucesso", Task.subscriber_id.is_not(None)
                )
            ).scalar_one()
        assert done == n, f"{done} of {n} delivered"
        return n / elapsed
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
