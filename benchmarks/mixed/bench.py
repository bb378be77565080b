"""Mixed-duration workloads: sqla-queue beside pgqueuer and procrastinate.

    <python> benchmarks/mixed/bench.py SYSTEM CASE TAG [--pgq-mode cap|eplimit]

SYSTEM: sqla_queue | sqla_queue_async | pgqueuer | procrastinate (run with
a python that has it installed: the project's venv for sqla-queue, a peer's
venv for a peer; benchmarks/mixed/run.sh makes them and runs every system
in one invocation). CASE:

- ``neighbours``: an idle worker with 4 lanes; 200 tasks enqueued in one
  transaction, tasks 100-102 sleep 5 s, the others nothing;
- ``long-tail``: 300 tasks a second for 10 s (3 a transaction, every
  10 ms), 1 in 100 sleeps 0.5 s, the others 2 ms; 8 lanes;
- ``bimodal`` (ours): 100 tasks a second for 20 s, 1 in 50 is a 1 s call
  (a third-party API), the others 5 ms of work; 4 lanes, about 60% busy.
  sqla-queue's handler reads first (``SELECT 1`` on its Session) and then
  sleeps: its transaction is open during the call (the hard case for
  committing its neighbours' outcomes: docs/lifecycle.md).

Every handler sleeps its task's duration (time.sleep in a sync sqla-queue
worker, asyncio.sleep in the others), then writes one effect row
(``mix_effect``): sqla-queue's through the handler's Session, so it
commits with the task's ``sucesso``; the peers' on an autocommit
connection of their own (they give a handler no transaction). Before the
case, every system's worker runs a few instant tasks and then sits idle
for 3 s (warm_up; MIXED_COLD=1 measures a just-started worker instead).
An observer polls every 5 ms (MIXED_POLL_SECONDS; 50 ms until 2026-11-29
afternoon) which tasks are done as a caller sees it (sqla-queue: the
committed ``sucesso``; pgqueuer: the job row gone; procrastinate: status
``succeeded``) and which effect rows exist. This is the method of
../shared/bench/mixed/bench.py (the issue's), with sqla-queue's side and a
third case added. PostgreSQL at 127.0.0.1:5432 (autovacuum off here: the
figures are with no vacuum), user postgres, database mixed_SYSTEM.
Results: benchmarks/results/mixed/SYSTEM_CASE_TAG.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
RESULTS = Path(os.environ.get("MIXED_RESULTS", HERE.parent / "results" / "mixed"))
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
POLL_SECONDS = float(os.environ.get("MIXED_POLL_SECONDS", "0.005"))
#: run a few tasks on every lane before the case (warm_up); keys from WARM_KEYS
WARM = os.environ.get("MIXED_COLD", "") != "1"
WARM_KEYS = 1_000_000

#: case -> (lanes, seconds to wait for the last task, tasks per transaction,
#: seconds between transactions)
CASES: dict[str, tuple[int, float, int | None, float]] = {
    "neighbours": (4, 60, None, 0.0),
    "long-tail": (8, 120, 3, 0.01),
    "bimodal": (4, 120, 1, 0.01),
}


def durations_of(case: str) -> list[float]:
    if case == "neighbours":
        return [5.0 if i in (100, 101, 102) else 0.0 for i in range(200)]
    if case == "long-tail":
        rnd = random.Random(7)
        return [0.5 if rnd.random() < 0.01 else 0.002 for _ in range(3000)]
    rnd = random.Random(11)
    return [1.0 if rnd.random() < 0.02 else 0.005 for _ in range(2000)]


def is_short(case: str, seconds: float) -> bool:
    return seconds < 0.1


class System:
    """One system's schema, enqueue, done-query and worker command."""

    def __init__(self, name: str, url: str, lanes: int, pgq_mode: str) -> None:
        self.name, self.url, self.lanes, self.pgq_mode = name, url, lanes, pgq_mode

    def install(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute(
                "CREATE TABLE mix_effect(job_key int primary key, "
                "t timestamptz default clock_timestamp())"
            )
        if self.name.startswith("sqla_queue"):
            import mixed_worker

            mixed_worker.create(self.url)
        elif self.name == "pgqueuer":
            import asyncio

            import asyncpg
            from pgqueuer.db import AsyncpgDriver
            from pgqueuer.queries import Queries

            async def install() -> None:
                conn = await asyncpg.connect(self.url)
                try:
                    await Queries(AsyncpgDriver(conn)).install()
                finally:
                    await conn.close()

            asyncio.run(install())
        else:
            from procrastinate import App, PsycopgConnector

            app = App(connector=PsycopgConnector(conninfo=self.url))
            with app.open():
                app.schema_manager.apply_schema()

    def worker(self) -> list[str]:
        if self.name.startswith("sqla_queue"):
            kind = "AsyncJob" if self.name == "sqla_queue_async" else "Job"
            return [
                sys.executable, "-m", "sqla_queue.cli", "worker", f"mixed_worker:{kind}",
                "--url", self.url.replace("postgresql://", "postgresql+psycopg://"),
                "--concurrency", str(self.lanes),
                "--log-level", os.environ.get("MIXED_LOG_LEVEL", "WARNING"),
            ]  # fmt: skip
        args = [sys.executable, str(HERE / f"worker_{self.name}.py"), self.url, str(self.lanes)]
        return args + ([self.pgq_mode] if self.name == "pgqueuer" else [])

    def enqueuer(self, case: str) -> Any:
        if self.name.startswith("sqla_queue"):
            import mixed_worker

            return mixed_worker.Enqueuer(self.url, read_first=case == "bimodal")
        return PeerEnqueuer(self.name, self.url)

    def done(self, conn: psycopg.Connection[Any], known: list[int]) -> list[int]:
        if self.name.startswith("sqla_queue"):
            return [r[0] for r in conn.execute("SELECT id FROM mix_tasks WHERE status = 'sucesso'")]
        if self.name == "pgqueuer":
            left = {r[0] for r in conn.execute("SELECT id FROM pgqueuer")}
            return [i for i in known if i not in left]
        return [
            r[0]
            for r in conn.execute("SELECT id FROM procrastinate_jobs WHERE status = 'succeeded'")
        ]


class PeerEnqueuer:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.conn = psycopg.connect(url, autocommit=True)
        if name == "pgqueuer":
            from pgqueuer.db import SyncPsycopgDriver
            from pgqueuer.queries import SyncQueries

            self.q = SyncQueries(SyncPsycopgDriver(self.conn))
        else:
            from procrastinate import App, PsycopgConnector

            self.app = App(connector=PsycopgConnector(conninfo=url))

            @self.app.task(name="job")
            def job(k: int, s: float) -> None:  # the producer's declaration only
                pass

            self.task = job
            self.app.open()

    def enqueue(self, part: list[tuple[int, float]]) -> list[int]:
        with self.conn.transaction():
            if self.name == "pgqueuer":
                payloads = [json.dumps({"k": k, "s": s}).encode() for k, s in part]
                return list(self.q.enqueue(["job"] * len(part), payloads, [0] * len(part)))
            deferred = self.task.configure(connection=self.conn)
            return list(deferred.batch_defer(*({"k": k, "s": s} for k, s in part)))

    def close(self) -> None:
        self.conn.close()


def observe(system: System, want: int, stop: threading.Event, state: dict[str, Any]) -> None:
    conn = psycopg.connect(system.url, autocommit=True)
    seen_effect, seen_done = state["effect"], state["done"]
    while not stop.is_set() and (len(seen_effect) < want or len(seen_done) < want):
        known = list(state["ids"])  # ids whose enqueue had committed before this poll
        keys = [r[0] for r in conn.execute("SELECT job_key FROM mix_effect")]
        now_effect = time.monotonic()
        done = system.done(conn, known)
        now = time.monotonic()
        for k in keys:
            seen_effect.setdefault(k, now_effect)
        for i in done:
            if i in state["id2key"]:
                seen_done.setdefault(state["id2key"][i], now)
        time.sleep(POLL_SECONDS)
    conn.close()


def warm_up(system: System, enqueuer: Any, lanes: int) -> None:
    """Every lane of the worker runs a few instant tasks (keys from
    WARM_KEYS, outside the figures) before the case starts: the case then
    measures a worker that has run before and sits idle, as a user's does,
    not its first seconds (each system's first statements, compiled and
    planned once per process and connection). MIXED_COLD=1 skips this."""
    n = 4 * lanes
    for k0 in range(WARM_KEYS, WARM_KEYS + n, 2):
        enqueuer.enqueue([(k0, 0.0), (k0 + 1, 0.0)])
        time.sleep(0.01)
    deadline = time.monotonic() + 60
    with psycopg.connect(system.url, autocommit=True) as c:
        while True:
            done = c.execute(
                "SELECT count(*) FROM mix_effect WHERE job_key >= %s", (WARM_KEYS,)
            ).fetchone()[0]  # type: ignore[index]
            if done >= n:
                return
            assert time.monotonic() < deadline, f"warm-up: {done} of {n} tasks done in 60 s"
            time.sleep(0.05)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def figures(
    case: str, enq: dict[int, float], seen: dict[int, float], durations: list[float]
) -> dict[str, Any]:
    n = len(durations)
    short = [seen[k] - enq[k] for k in range(n) if is_short(case, durations[k]) and k in seen]
    out: dict[str, Any] = {"seen": len(seen), "of": n, "short_n": len(short)}
    if not short:
        return out
    out.update(
        short_p50=statistics.median(short),
        short_p95=pct(short, 95),
        short_p99=pct(short, 99),
        short_max=max(short),
    )
    t0 = min(enq.values())
    out["all_done_s"] = (max(seen.values()) - t0) if len(seen) == n else None
    longs = [seen[k] - enq[k] for k in range(n) if not is_short(case, durations[k]) and k in seen]
    out["long_p50"] = statistics.median(longs) if longs else None
    return out


def run(system: System, case: str, tag: str) -> dict[str, Any]:
    lanes, limit, per_txn, every = CASES[case]
    durations = durations_of(case)
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        db = system.url.rsplit("/", 1)[1]
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")  # a worker left by a killed run
        admin.execute(f"CREATE DATABASE {db}")
    system.install()
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = open(RESULTS / f"{system.name}_{case}_{tag}.worker.log", "w")  # noqa: SIM115
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    worker = subprocess.Popen(system.worker(), stdout=log, stderr=subprocess.STDOUT, env=env)
    enqueuer = system.enqueuer(case)
    state: dict[str, Any] = {"effect": {}, "done": {}, "ids": [], "id2key": {}}
    enq_t: dict[int, float] = {}
    stop = threading.Event()
    late = 0
    try:
        time.sleep(3)  # an idle worker, as a user's would be
        assert worker.poll() is None, "worker exited at start"
        if WARM:
            warm_up(system, enqueuer, lanes)
            time.sleep(3)  # idle again
        watcher = threading.Thread(
            target=observe, args=(system, len(durations), stop, state), daemon=True
        )
        watcher.start()
        step = per_txn or len(durations)
        next_at = time.monotonic()
        for k0 in range(0, len(durations), step):
            part = [(k, durations[k]) for k in range(k0, min(len(durations), k0 + step))]
            ids = enqueuer.enqueue(part)
            now = time.monotonic()
            for (k, _), i in zip(part, ids, strict=True):
                enq_t[k] = now
                state["id2key"][i] = k
            state["ids"].extend(ids)
            next_at += every
            if next_at < time.monotonic():
                late += 1
            time.sleep(max(0.0, next_at - time.monotonic()))
        watcher.join(limit)
        with psycopg.connect(system.url, autocommit=True) as c:
            effect_rows = c.execute(
                "SELECT count(*) FROM mix_effect WHERE job_key < %s", (WARM_KEYS,)
            ).fetchone()[0]  # type: ignore[index]
    finally:
        stop.set()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        enqueuer.close()
        log.close()
    result = {
        "system": system.name,
        "case": case,
        "tag": tag,
        "lanes": lanes,
        "pgq_mode": system.pgq_mode if system.name == "pgqueuer" else None,
        "late_ticks": late,
        "warm": WARM,
        "poll_seconds": POLL_SECONDS,
        "effect_rows": effect_rows,
        "done": figures(case, enq_t, state["done"], durations),
        "effect": figures(case, enq_t, state["effect"], durations),
    }
    with open(RESULTS / f"{system.name}_{case}_{tag}.json", "w") as f:
        json.dump(
            {
                "res": result,
                "enq": enq_t,
                "done": state["done"],
                "effect": state["effect"],
                "durations": durations,
            },
            f,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "system", choices=["sqla_queue", "sqla_queue_async", "pgqueuer", "procrastinate"]
    )
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("tag")
    parser.add_argument("--pgq-mode", default="cap", choices=["cap", "eplimit"])
    args = parser.parse_args()
    url = f"postgresql://postgres@127.0.0.1:5432/mixed_{args.system}"
    system = System(args.system, url, CASES[args.case][0], args.pgq_mode)
    print(json.dumps(run(system, args.case, args.tag)))


if __name__ == "__main__":
    main()
