"""Progress bars (rich) for the CLI's long jobs: the maintenance routines,
a requeue, Spark's enqueue, report and archive. Drawn on standard error,
and only when it is a terminal: piped, logged or in CI, a command prints
its usual lines and nothing else. The bar goes away when the job ends,
leaving the command's own summary."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..common.progress import Progress

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[Progress | None]:
    """A :data:`~sqla_queue.common.progress.Progress` that draws a bar labelled
    ``label``; None (report nothing) when standard error is no terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    from rich import progress as rich_progress

    bar = rich_progress.Progress(
        rich_progress.SpinnerColumn(),
        rich_progress.TextColumn("[bold]{task.description}"),
        rich_progress.BarColumn(),
        rich_progress.TextColumn("{task.fields[note]}"),
        rich_progress.TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with bar:
        task = bar.add_task(label, total=None, note="")

        def report(done: int, total: int | None, note: str) -> None:
            bar.update(task, completed=done, total=total, note=note)

        yield report
