"""A longer storm than the suite's fleet test, run by hand (not collected:
its name does not start with ``test_``), for a change to the claim, the
completion or the rescue::

    STORM_MINUTES=4 SQLA_QUEUE_REQUIRE_DATABASES=1 .venv/bin/python -m pytest \
        -q -s -p no:cacheprovider --timeout 800 tests/faults/storm_run.py

Four CLI workers (two lanes each); for STORM_MINUTES, tasks keep arriving,
one worker is SIGKILLed and replaced every few seconds, the server's
backends are terminated now and then, and the server restarts twice; and
(where iptables and a cgroup v2 hierarchy are at hand, as for
tests/faults/test_partition.py) the first worker, never killed, is cut off
from the server for 15 s of every 30 without anything closed. Then every
chain must have finished exactly once with one effect, no worker may have
exited on its own, and the longest gap between two completions is printed.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise

from sqlalchemy import select

from sqla_queue import QueueClient
from tests.acceptance.test_concurrency import (
    Spawned,
    statuses,
    stop_gracefully,
    worker_env,
)
from tests.conftest import WORKER_CLASSES, spawn_cli, wait_until
from tests.faults import test_partition
from tests.faults.test_fleet import OPEN, _mixed, assert_each_chain_ran_once
from tests.support.app import build
from tests.support.servers import PrivatePostgres

cuts = test_partition.cuts  # the fixture, here too


def test_storm(
    private_postgres: PrivatePostgres, table_name: str, cuts: Callable[..., test_partition.Cut]
) -> None:
    minutes = float(os.environ.get("STORM_MINUTES", "5"))
    app = build(table_name)
    engine = private_postgres.engine(pool_pre_ping=True)
    app.Base.metadata.create_all(engine)
    env = worker_env(table_name, SQLA_QUEUE_TEST_LEASE="3")
    recording = WORKER_CLASSES["sync"]["recording"]
    options = ["--concurrency", "2", "--log-level", "WARNING"]
    args = ("worker", recording, "--url", private_postgres.url, *options)
    rng = random.Random(7)
    # the first worker in a cgroup whose packets can be dropped; never killed
    cut = cuts(private_postgres.port)
    workers = [Spawned(cut.spawn(*args, env=env))]
    workers += [Spawned(spawn_cli(*args, env=env)) for _ in range(3)]
    ids: list[int] = []
    kills = terminations = restarts = partitions = 0
    try:
        end = time.monotonic() + minutes * 60
        restart_at = {int(minutes * 60 * 0.3), int(minutes * 60 * 0.7)}
        start = time.monotonic()
        tick = 0
        while time.monotonic() < end:
            try:
                # mixed durations, as the fleet test's
                with engine.begin() as conn:
                    ids.extend(
                        QueueClient(conn, app.Task).insert_tasks(
                            {"process": "bulk", "payload": _mixed(len(ids) + n)} for n in range(300)
                        )
                    )
            except Exception as exc:  # the server restarting: the batch rolled back
                print("enqueue failed:", type(exc).__name__)
                engine.dispose()
            for worker in workers:  # none exited on its own
                assert worker.proc.poll() is None, worker.output
            victim = rng.randrange(1, len(workers))
            workers[victim].kill()
            kills += 1
            workers[victim] = Spawned(spawn_cli(*args, env=env))
            if tick % 3 == 0:
                private_postgres.terminate_backends()
                terminations += 1
            elapsed = int(time.monotonic() - start)
            if elapsed >= 10 and elapsed % 30 < 15 and not cut.active:
                cut.start()  # the first worker cut off, nothing closed
                partitions += 1
            elif elapsed % 30 >= 15 and cut.active:
                cut.heal()
            if any(elapsed >= r for r in restart_at):
                restart_at = {r for r in restart_at if r > elapsed}
                private_postgres.restart("fast" if restarts == 0 else "immediate")
                engine.dispose()
                restarts += 1
            tick += 1
            time.sleep(2)  # the storm's pace, not a wait for a condition
        cut.heal()
        wait_until(
            lambda: not OPEN & set(statuses(engine, app).values()),
            timeout=180,
            message="every task to finish",
        )
        stop_gracefully(workers)
    finally:
        for w in workers:
            w.kill()
    rows = assert_each_chain_ran_once(engine, app, ids)
    by_status = Counter(status for _, _, status in rows)
    with engine.connect() as conn:
        finished = (
            conn.execute(
                select(app.Task.finished_at)
                .where(app.Task.status == "sucesso")
                .order_by(app.Task.finished_at)
            )
            .scalars()
            .all()
        )
    stall = max(
        ((b - a).total_seconds() for a, b in pairwise(finished)),
        default=0.0,
    )
    print(
        f"STORM: {len(ids)} tasks, {kills} SIGKILLs, {terminations} terminations, "
        f"{restarts} restarts, {partitions} cuts of the first worker; rows {dict(by_status)}; "
        f"{by_status['sucesso']} chains finished once each; the longest gap between two "
        f"completions {stall:.1f} s"
    )
    engine.dispose()
