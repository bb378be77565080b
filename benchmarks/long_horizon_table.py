"""Markdown tables of ``benchmarks/long_horizon.py`` results, side by side:
per minute, each (file label, system)'s claim latency p50 / p99 in ms, then
dead tuples and total MB, and a summary line per system (bytes per finished
task, the last minute's p50 over the first's).

    .venv/bin/python benchmarks/long_horizon_table.py A.json [B.json ...]
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any


def columns(paths: list[str]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in paths:
        data = json.loads(pathlib.Path(path).read_text())
        label = data["settings"].get("label") or pathlib.Path(path).stem
        for system, result in data["systems"].items():
            if result.get("rows"):
                found.append((f"{label}: {system}", result))
    return found


def render(found: list[tuple[str, dict[str, Any]]]) -> str:
    minutes = max(len(result["rows"]) for _, result in found)
    head = "| minute | " + " | ".join(name for name, _ in found) + " |"
    lines = [head, "|---:|" + "---:|" * len(found)]
    for minute in range(minutes):
        cells = []
        for _, result in found:
            rows = result["rows"]
            if minute < len(rows):
                row = rows[minute]
                cells.append(f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f}")
            else:
                cells.append("")
        lines.append(f"| {minute + 1} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| system | dead tuples at the end | MB at the end | bytes per finished task "
        "| last p50 / first p50 | last p99 / first p99 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, result in found:
        first, last = result["rows"][0], result["rows"][-1]
        lines.append(
            f"| {name} | {result['final']['n_dead_tup']:,} "
            f"| {result['final']['total_bytes'] / 1e6:.1f} | {result['bytes_per_task']:.0f} "
            f"| {last['p50_ms'] / first['p50_ms']:.2f} | {last['p99_ms'] / first['p99_ms']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    print(render(columns(parser.parse_args().files)))


if __name__ == "__main__":
    main()
