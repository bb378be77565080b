"""Progress of a running Spark job, printed while the driver waits for it.

A thread polls Spark's status tracker every ``interval`` seconds and prints
a line when a stage's completed tasks change: the commands' progress, on
any master (Spark's console progress bar is off: it draws over log lines).
Given a ``report`` (the CLI's bar on a terminal, :mod:`sqla_queue.common.progress`),
it is told the tasks done of every stage seen so far instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ..common.progress import Progress as Report

__all__ = ["Progress"]

INTERVAL_SECONDS = 2.0


class Progress:
    """``with Progress(spark, "enqueue", echo): ...`` prints stage progress."""

    def __init__(
        self,
        spark: SparkSession,
        label: str,
        echo: Callable[[str], None],
        interval: float = INTERVAL_SECONDS,
        *,
        report: Report | None = None,
    ) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.label = label
        self.echo = echo
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqla-queue-progress", daemon=True)
        self._seen: dict[int, tuple[int, int]] = {}
        self.report = report

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval * 2)

    def poll(self) -> list[str]:
        """Lines for the stages whose progress changed since the last poll."""
        lines = []
        for stage_id in sorted(self.tracker.getActiveStageIds()):
            info = self.tracker.getStageInfo(stage_id)
            if info is None:
                continue
            state = (info.numCompletedTasks, info.numTasks)
            if self._seen.get(stage_id) != state:
                self._seen[stage_id] = state
                lines.append(
                    f"{self.label}: stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} "
                    f"tasks done, {info.numActiveTasks} running"
                )
        return lines

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            lines = self.poll()
            if self.report is None:
                for line in lines:
                    self.echo(line)
            elif lines:
                done = sum(completed for completed, _ in self._seen.values())
                total = sum(tasks for _, tasks in self._seen.values())
                self.report(done, total, f"Spark tasks, {len(self._seen)} stage(s)")
