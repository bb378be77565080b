"""How a long job reports its progress: a callable the job calls after each
step (a chunk deleted, a chunk inserted), ``progress(done, total, note)``:
``done`` items so far, ``total`` when known (else None), ``note`` the
counts so far in words. The CLI draws it as a rich progress bar on a
terminal (``sqla_queue.cli.progress``); code that passes nothing pays
nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["Progress", "describe_counts"]

#: ``progress(done, total, note)``, called after each step of a long job
Progress = Callable[[int, "int | None", str], None]


def describe_counts(counts: Mapping[str, int]) -> str:
    """``{"deleted_rows": 3}`` as ``deleted rows 3``."""
    return ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in counts.items())
