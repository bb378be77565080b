"""The queue report a person reads: Markdown with PNG plots (matplotlib).

It is drawn from the small aggregated tables the analytics job computed
(pandas DataFrames on the driver), never from the queue's rows.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

__all__ = ["render_report"]

FIGURE_ROWS_SHOWN = 100
_PLOT_SIZE = (9, 3.6)


def duration(seconds: Any) -> str:
    """``0.5`` -> ``500 ms``, ``90`` -> ``90.0 s``, ``600`` -> ``10.0 min``."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    value = float(seconds)
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    if abs(value) < 120:
        return f"{value:.1f} s"
    if abs(value) < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _percent(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{float(value) * 100:.1f}%"


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.1f}" if isinstance(value, float) and not value.is_integer() else f"{value:,}"


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # an integer column with nulls comes as floats
    return str(value).replace("|", "\\|")


def _percentiles(row: Any, kind: str) -> str:
    return " / ".join(duration(row[f"{kind}_p{p}"]) for p in (50, 95, 99))


_SUMMARY_HEADER = (
    "| {label} | tasks | attempts | success | failed attempts | dead letter | retries per task "
    "| open | queue wait p50 / p95 / p99 | run time p50 / p95 / p99 | throughput |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def _summary_rows(frame: Any, label: Any) -> list[str]:
    lines = []
    for _, row in frame.iterrows():
        lines.append(
            f"| {_cell(label(row))} | {_number(row['tasks'])} | {_number(row['attempts'])} "
            f"| {_percent(row['success_rate'])} | {_percent(row['failure_rate'])} "
            f"| {_percent(row['dead_letter_rate'])} | {_number(row['retries_per_task'])} "
            f"| {_number(row['open'])} | {_percentiles(row, 'wait')} "
            f"| {_percentiles(row, 'run')} | {_throughput(row['throughput'])} |"
        )
    return lines


def _throughput(value: Any) -> str:
    """Per second, or per minute or hour when that reads better than 0.0/s."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    for unit, seconds in (("s", 1), ("min", 60), ("h", 3600)):
        if float(value) * seconds >= 1 or unit == "h":
            return f"{float(value) * seconds:,.1f}/{unit}"
    return "–"  # pragma: no cover


def _plots(out: Path, figures: Any, by_day: Any) -> list[tuple[str, str]]:
    """Draw the per-day plots; (title, file name) of each."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    drawn: list[tuple[str, str]] = []
    if by_day.empty:
        return drawn
    days = [str(day) for day in by_day["day"]]

    volume = figures.groupby(["day", "processo"], dropna=False)["tasks"].sum().unstack(fill_value=0)
    fig, ax = plt.subplots(figsize=_PLOT_SIZE)
    bottom = [0] * len(volume.index)
    for process in volume.columns:
        values = list(volume[process])
        ax.bar([str(d) for d in volume.index], values, bottom=bottom, label=str(process))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("tasks (chains)")
    ax.legend(fontsize="small", ncols=min(4, len(volume.columns)))
    drawn.append(("Tasks per day, by process", _save(fig, out, "tasks_per_day.png")))

    fig, ax = plt.subplots(figsize=_PLOT_SIZE)
    for column, label in (
        ("success_rate", "success (of tasks)"),
        ("failure_rate", "failed attempts (of attempts)"),
        ("dead_letter_rate", "dead letter (of tasks)"),
    ):
        ax.plot(days, [_nan(v) * 100 for v in by_day[column]], marker="o", label=label)
    ax.set_ylabel("%")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    drawn.append(("Outcomes per day", _save(fig, out, "outcomes_per_day.png")))

    fig, axes = plt.subplots(1, 2, figsize=(_PLOT_SIZE[0], _PLOT_SIZE[1]), sharex=True)
    for ax, kind, title in ((axes[0], "wait", "queue wait"), (axes[1], "run", "run time")):
        for p in (50, 95, 99):
            ax.plot(days, [_nan(v) for v in by_day[f"{kind}_p{p}"]], marker="o", label=f"p{p}")
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel("seconds")
        if any(_nan(v) > 0 for v in by_day[f"{kind}_p99"]):
            ax.set_yscale("log")
        ax.legend(fontsize="small")
        ax.tick_params(axis="x", labelrotation=30)
    drawn.append(("Queue wait and run time per day", _save(fig, out, "latency_per_day.png")))
    return drawn


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def _save(fig: Any, out: Path, name: str) -> str:
    from matplotlib import pyplot as plt

    fig.autofmt_xdate() if len(fig.axes) == 1 else None
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def render_report(
    out: Path,
    *,
    table_name: str,
    rows: int,
    figures: Any,
    by_day: Any,
    by_process: Any,
    slowest_chains: Any,
) -> Path:
    """Write ``out/report.md`` and its plots; its path."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Queue report: `{table_name}`",
        "",
        f"{rows:,} rows (attempts) read on {now}. Days are the UTC day a chain started; "
        "the definitions are in sqla-queue's docs/spark-report.md. Every figure is in "
        "`figures.parquet` (per process, tenant and day), `by_day.parquet` and "
        "`slowest_chains.parquet` beside this file.",
        "",
        "## By process",
        "",
        _SUMMARY_HEADER.format(label="process"),
        *_summary_rows(by_process, lambda row: row["processo"]),
        "",
        "## By day",
        "",
    ]
    for title, name in _plots(out, figures, by_day):
        lines += [f"![{title}]({name})", ""]
    lines += [
        _SUMMARY_HEADER.format(label="day"),
        *_summary_rows(by_day, lambda row: row["day"]),
        "",
        "## Slowest chains",
        "",
        "Closed tasks, from their first due time to the end of their last attempt.",
        "",
        "| chain (id) | process | tenant | attempts | last status | first due | duration |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, row in slowest_chains.iterrows():
        lines.append(
            f"| {row['chain']} | {_cell(row['processo'])} | {_cell(row['tenant'])} "
            f"| {row['attempts']} | {_cell(row['status'])} | {_cell(row['first_due'])} "
            f"| {duration(row['duration'])} |"
        )
    shown = figures.head(FIGURE_ROWS_SHOWN)
    lines += [
        "",
        "## By process, tenant and day",
        "",
        f"{len(shown)} of {len(figures)} rows (all of them in `figures.parquet`).",
        "",
        _SUMMARY_HEADER.format(label="process · tenant · day"),
        *_summary_rows(
            shown, lambda row: f"{row['processo']} · {_cell(row['tenant'])} · {row['day']}"
        ),
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
