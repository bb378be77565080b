"""Plot results of ``benchmarks/long_horizon.py``: one PNG, two panels
(claim latency p50 per minute on a log scale; dead tuples of the queue table
per minute), one line per (file label, system).

matplotlib is not a dependency of the project and is not in its venv; this
script runs with a separate venv that has it:

    python3 -m venv /tmp/lh-plot-venv && /tmp/lh-plot-venv/bin/pip install matplotlib
    /tmp/lh-plot-venv/bin/python benchmarks/long_horizon_plot.py \\
        benchmarks/results/long_horizon/A.json [B.json ...] [--out plot.png]

A file's label is its ``settings.label`` (``long_horizon.py --label``), else
its file name without ``.json``; ``FILE=LABEL`` on the command line overrides
both. The PNG goes to ``--out`` (default: beside the first file, ``.png``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import ticker


def load(spec: str) -> tuple[str, dict[str, Any]]:
    """``FILE`` or ``FILE=LABEL`` -> (label, the results)."""
    path_text, _, label = spec.partition("=")
    path = pathlib.Path(path_text)
    data = json.loads(path.read_text())
    return label or data.get("settings", {}).get("label") or path.stem, data


def plot(files: list[tuple[str, dict[str, Any]]], out: pathlib.Path) -> None:
    fig, (latency, dead) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    for label, data in files:
        settings = data.get("settings", {})
        detail = f"autovacuum {settings.get('autovacuum', '?')}"
        if settings.get("pin_horizon_minutes"):
            a, b = settings["pin_horizon_minutes"]
            detail += f", pin {a:g}-{b:g} min"
        for system, result in data.get("systems", {}).items():
            rows = result.get("rows")
            if not rows:
                continue
            name = f"{label} / {system}"
            minutes = [r["minute"] for r in rows]
            p50 = [r["p50_ms"] for r in rows]
            latency.plot(minutes, p50, marker=".", label=f"{name} ({detail})")
            dead.plot(minutes, [r["n_dead_tup"] for r in rows], marker=".", label=name)
    latency.set_yscale("log")
    latency.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    latency.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    latency.yaxis.set_minor_formatter(ticker.NullFormatter())
    latency.set_ylabel("claim latency p50 (ms, log)")
    latency.set_title("handler start - enqueue commit, tasks enqueued in each minute")
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="small")
    dead.set_ylabel("n_dead_tup, queue table")
    dead.set_xlabel("minute of the run")
    dead.grid(True, alpha=0.3)
    dead.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    dead.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Plot long_horizon.py results.")
    parser.add_argument("files", nargs="+", metavar="FILE[=LABEL]")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    files = [load(spec) for spec in args.files]
    out = args.out or pathlib.Path(args.files[0].partition("=")[0]).with_suffix(".png")
    plot(files, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
