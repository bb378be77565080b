"""The dashboard's history: attempts finished per time bucket and process,
as succeeded, failed and cancelled (``GET /api/history``, the overview's
chart).

``finished_at`` has no index, and a table holds millions of finished
attempts, so the history reads only the primary-key ranges that may hold an
attempt finished in the window: the status counts (``status_counts``) keep
each range's newest finish, and count a range again when one of its open
attempts finished; the others are skipped. A window's buckets end at the
next whole bucket after ``now`` (UTC), so a minute's count grows in place
while the page refreshes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Table

from ...adapters import adapter_of
from ...common.types import utcnow
from .. import status_counts

__all__ = ["SERIES", "WINDOWS", "Bucket", "History", "chart", "finished_history"]

#: a window's name: (its length, its bucket), seconds
WINDOWS = {"hour": (3600, 60), "day": (86400, 900)}


@dataclass(frozen=True)
class Bucket:
    """The attempts of ``process`` that finished from ``at`` to ``at`` + the bucket."""

    at: dt.datetime
    process: str
    succeeded: int
    failed: int
    cancelled: int

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "process": self.process,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
        }


@dataclass(frozen=True)
class History:
    """A window's buckets (only those with an attempt), oldest first."""

    window: str
    since: dt.datetime
    until: dt.datetime
    bucket_seconds: int
    buckets: list[Bucket]

    def as_json(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "bucket_seconds": self.bucket_seconds,
            "buckets": [bucket.as_json() for bucket in self.buckets],
        }

    def totals(self) -> list[tuple[dt.datetime, tuple[int, int, int]]]:
        """Every bucket of the window, oldest first: its start and its
        (succeeded, failed, cancelled) over all processes, zeros included."""
        count = int((self.until - self.since).total_seconds()) // self.bucket_seconds
        sums = [[0, 0, 0] for _ in range(count)]
        for bucket in self.buckets:
            i = int((bucket.at - self.since).total_seconds()) // self.bucket_seconds
            sums[i][0] += bucket.succeeded
            sums[i][1] += bucket.failed
            sums[i][2] += bucket.cancelled
        step = dt.timedelta(seconds=self.bucket_seconds)
        return [(self.since + i * step, (s, f, c)) for i, (s, f, c) in enumerate(sums)]


def finished_history(
    engine: Engine, table: Table, *, window: str, now: dt.datetime | None = None
) -> History:
    """The attempts of ``table`` finished in ``window`` (one of
    :data:`WINDOWS`) up to ``now``, per bucket and process. Raises KeyError
    for another window."""
    seconds, step = WINDOWS[window]
    now = now or utcnow()
    epoch = now.timestamp()
    until = dt.datetime.fromtimestamp(epoch - epoch % step + step, dt.timezone.utc)
    since = until - dt.timedelta(seconds=seconds)
    adapter = adapter_of(engine.dialect, table, task_locks=False)
    queries = adapter.inspection
    found: dict[tuple[int, str], list[int]] = {}
    with engine.connect() as conn:
        ranges = status_counts.ranges_finished_since(conn, queries, since=since, now=now)
        for low, high in ranges:
            for row in queries.finished_history(
                conn,
                low=low,
                high=high,
                since=since,
                bucket_seconds=step,
                buckets=seconds // step,
            ):
                sums = found.setdefault((int(row.bucket), row.processo or ""), [0, 0, 0])
                sums[0] += int(row.succeeded or 0)
                sums[1] += int(row.failed or 0)
                sums[2] += int(row.cancelled or 0)
    status_counts.save_counted(engine, queries, own=True)
    delta = dt.timedelta(seconds=step)
    buckets = [
        Bucket(since + k * delta, process, *sums) for (k, process), sums in sorted(found.items())
    ]
    return History(window, since, until, step, buckets)


#: the chart's size and its plot's margins (px)
CHART_WIDTH, CHART_HEIGHT = 720, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 14, 46
#: a time label every this many buckets, per window
_LABEL_EVERY = {"hour": 10, "day": 12}
#: the chart's series: (name, css class)
SERIES = (("succeeded", "ok"), ("failed", "bad"), ("cancelled", "cancel"))


def chart(history: History) -> dict[str, Any]:
    """The overview's SVG chart of ``history`` (totals over the processes),
    as the template draws it: each series' polyline points, the y axis's
    ticks (count, y) and the x axis's (label, x), in the plot's pixels."""
    totals = history.totals()
    width = CHART_WIDTH - _LEFT - _RIGHT
    height = CHART_HEIGHT - _TOP - _BOTTOM
    top = max([1, *(max(counts) for _, counts in totals)])
    step = width / len(totals)

    def y(value: float) -> float:
        return round(_TOP + height - value / top * height, 1)

    def x(i: float) -> float:
        return round(_LEFT + i * step, 1)

    lines = {
        name: " ".join(f"{x(i + 0.5)},{y(counts[k])}" for i, (_, counts) in enumerate(totals))
        for k, (name, _) in enumerate(SERIES)
    }
    every = _LABEL_EVERY.get(history.window, 10)
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "left": _LEFT,
        "right": CHART_WIDTH - _RIGHT,
        "top": _TOP,
        "bottom": CHART_HEIGHT - _BOTTOM,
        "series": [(name, css, lines[name]) for name, css in SERIES],
        # the legend, below the time labels: (name, css, total, x)
        "legend": [
            (name, css, sum(counts[k] for _, counts in totals), _LEFT + k * 170)
            for k, (name, css) in enumerate(SERIES)
        ],
        "y_ticks": [(value, y(value)) for value in sorted({0, (top + 1) // 2, top})],
        "x_ticks": [
            (totals[i][0].strftime("%H:%M"), x(i))
            for i in range(0, len(totals) + 1, every)
            if i < len(totals)
        ],
        "per": "minute" if history.bucket_seconds == 60 else f"{history.bucket_seconds // 60} min",
    }
