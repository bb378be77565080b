"""Issue 4's targets against one run's results: ratios to the best peer.

    python benchmarks/targets.py [--results benchmarks/results]

Reads <results>/peers/*.json (the harness's files, sqla_queue and the peers
of the same run) and <results>/growth.json, and prints a markdown table:
each target, the two numbers it compares (medians over the repetitions),
the ratio, and whether it is met. Nothing is hard-coded but the targets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

OURS = "sqla_queue"
CLIENT = "sqla_queue_client"


def load(results: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in results.glob("peers/*.json")}


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def setting(result: dict[str, Any], procs: int) -> str | None:
    """The first worker setting of ``result`` with ``procs`` processes."""
    for item in result["params"]["settings"]:
        if item["procs"] == procs and item["label"] in result["c"]:
            return str(item["label"])
    return None


def processing(result: dict[str, Any], procs: int) -> float | None:
    label = setting(result, procs)
    return median(result["c"][label], "rate") if label else None


def latency(result: dict[str, Any], key: str) -> float | None:
    runs = next(iter(result["d"].values()), [])
    return median(runs, key)


def best(
    peers: dict[str, dict[str, Any]], measure: Any, highest: bool = True
) -> tuple[float, str] | None:
    values = [(measure(r), r["peer"]) for r in peers.values()]
    values = [(v, name) for v, name in values if v is not None]
    if not values:
        return None
    return max(values) if highest else min(values)


def row(
    target: str, ours: float | None, other: tuple[float, str] | None, goal: float, lower: bool
) -> str:
    if ours is None or other is None:
        return f"| {target} | not measured | | | |"
    ratio = ours / other[0]
    met = ratio <= goal if lower else ratio >= goal
    return (
        f"| {target} | {ours:,.1f} | {other[0]:,.1f} ({other[1]}) | {ratio:.2f} | "
        f"{'yes' if met else '**no**'} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=str(Path(__file__).parent / "results"))
    results = Path(ap.parse_args().results)
    runs = load(results)
    ours, client = runs.get(OURS), runs.get(CLIENT)
    if ours is None:
        print(f"no {OURS}.json under {results}/peers", file=sys.stderr)
        return 1
    peers = {k: v for k, v in runs.items() if k not in (OURS, CLIENT, "pgbench")}
    pgqueuer = peers.get("pgqueuer")

    def only(result: dict[str, Any] | None, measure: Any) -> tuple[float, str] | None:
        if result is None or measure(result) is None:
            return None
        return measure(result), result["peer"]

    def enqueue(r: dict[str, Any]) -> float | None:
        return median(r["a"], "rate")

    def bulk(r: dict[str, Any]) -> float | None:
        return median(r["b"], "rate") if r.get("b") else None

    lines = [
        "| target | sqla-queue | compared with | ratio | met |",
        "|---|---|---|---|---|",
        row(
            "(a) ORM enqueue, jobs/s, >= 1.0x the best peer",
            enqueue(ours),
            best(peers, enqueue),
            1.0,
            False,
        ),
        row(
            "(a) QueueClient.insert_task, jobs/s, >= 1.1x the best peer",
            enqueue(client) if client else None,
            best(peers, enqueue),
            1.1,
            False,
        ),
        row(
            "(b) copy_tasks (COPY), jobs/s, >= 3x pgqueuer's batch API",
            bulk(ours),
            only(pgqueuer, bulk),
            3.0,
            False,
        ),
        row(
            "(b) insert_tasks, jobs/s, >= 3x pgqueuer's batch API",
            bulk(client) if client else None,
            only(pgqueuer, bulk),
            3.0,
            False,
        ),
        row(
            "(c) processing, 1 process, jobs/s, >= 1.3x pgqueuer's 1 process",
            processing(ours, 1),
            only(pgqueuer, lambda r: processing(r, 1)),
            1.3,
            False,
        ),
        row(
            "(c) processing, 4 processes, jobs/s, >= pgqueuer's 4",
            processing(ours, 4),
            only(pgqueuer, lambda r: processing(r, 4)),
            1.0,
            False,
        ),
        row(
            "(d) latency p50, ms, <= 0.8x the best peer's p50",
            latency(ours, "p50"),
            best(peers, lambda r: latency(r, "p50"), highest=False),
            0.8,
            True,
        ),
        row(
            "(d) latency p99, ms, <= the best peer's p99",
            latency(ours, "p99"),
            best(peers, lambda r: latency(r, "p99"), highest=False),
            1.0,
            True,
        ),
    ]
    growth_path = results / "growth.json"
    if growth_path.exists():
        growth = json.loads(growth_path.read_text())
        empty, full = statistics.median(growth["empty"]), statistics.median(growth["full"])
        idle = growth["idle"]
        rss = idle.get("rss_mib_max", idle.get("rss_mib", 0.0))
        lines += [
            row(
                f"(e) claim rate with {growth['finished_rows']:,} finished rows, >= 0.9x empty",
                full,
                (empty, "empty table"),
                0.9,
                False,
            ),
            f"| (e) idle worker RSS, < 60 MiB | {rss:.1f} MiB | | | "
            f"{'yes' if rss < 60 else '**no**'} |",
            f"| (e) idle worker CPU, < 1% of a core | {100 * idle['cpu_share_of_core']:.2f}% "
            f"| | | {'yes' if idle['cpu_share_of_core'] < 0.01 else '**no**'} |",
        ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
