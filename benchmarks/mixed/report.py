"""The table of benchmarks/mixed/run.sh's results, and a plot of the short
tasks' enqueue-to-commit latency (benchmarks/results/mixed/short_latency.png).

    python benchmarks/mixed/report.py [RESULTS_DIR]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "results" / "mixed"
CASES = ("neighbours", "long-tail", "bimodal")
#: what each case's table shows, from the observed commits ("done")
COLUMNS = {
    "neighbours": ("all_done_s", "short_p95"),
    "long-tail": ("short_p50", "short_p99"),
    "bimodal": ("short_p50", "short_p99"),
}


def label(res: dict[str, Any]) -> str:
    if res["system"] == "pgqueuer":
        return f"pgqueuer ({res['pgq_mode']})"
    return str(res["system"])


def load() -> dict[str, dict[str, list[dict[str, Any]]]]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        tag = str(data.get("res", {}).get("tag", ""))
        if "res" not in data or not tag.rsplit(".", 1)[-1].startswith("r"):
            continue
        runs[data["res"]["case"]][label(data["res"])].append(data)
    return runs


def span(values: list[float | None]) -> str:
    found = sorted(v for v in values if v is not None)
    if not found:
        return "-"
    low, high = found[0], found[-1]
    return f"{low:.3f}" if round(low, 3) == round(high, 3) else f"{low:.3f}-{high:.3f}"


def table(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    lines = []
    for case in CASES:
        if case not in runs:
            continue
        first, second = COLUMNS[case]
        lines.append(f"\n{case} (seconds, enqueue to committed; min-max over runs)\n")
        lines.append(f"| system | runs | {first} | {second} | short max | all seen |")
        lines.append("|---|---|---|---|---|---|")
        for system, data in sorted(runs[case].items()):
            done = [d["res"]["done"] for d in data]
            lines.append(
                f"| {system} | {len(data)} | {span([d.get(first) for d in done])} "
                f"| {span([d.get(second) for d in done])} "
                f"| {span([d.get('short_max') for d in done])} "
                f"| {all(d['seen'] == d['of'] for d in done)} |"
            )
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cases = [case for case in CASES if case in runs]
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        for system, data in sorted(runs[case].items()):
            latencies: list[float] = []
            for d in data:
                enq = {int(k): v for k, v in d["enq"].items()}
                done = {int(k): v for k, v in d["done"].items()}
                latencies += [
                    done[k] - enq[k] for k in done if d["durations"][k] < 0.1 and k in enq
                ]
            latencies.sort()
            if latencies:
                ys = [100 * (i + 1) / len(latencies) for i in range(len(latencies))]
                ax.plot(latencies, ys, label=system)
        ax.set_xscale("log")
        ax.set_xlabel("short task: enqueue to committed (s, log)")
        ax.set_ylabel("% of short tasks")
        ax.set_title(case)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    out = RESULTS / "short_latency.png"
    fig.savefig(out, dpi=90)
    return out


def main() -> None:
    runs = load()
    print(table(runs))
    out = plot(runs)
    if out is not None:
        print(f"\nplot: {out}")


if __name__ == "__main__":
    main()
