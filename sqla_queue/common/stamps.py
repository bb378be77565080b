"""Values given to every new task at enqueue by parts beside the core.

A stamp is a callable with no argument that returns column values (by
column name) for the task being enqueued now, or an empty mapping. The
flush hook and ``QueueClient``'s inserts call the registered stamps once
per enqueue call and set each value the task was not given. Nothing is
registered by default: the enqueue path then costs one truthiness test.

The OpenTelemetry integration (``sqla_queue.ops.tracing``) registers one that
stores the current trace context in ``trace_context``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

__all__ = ["Stamp", "current", "fill", "register", "registered", "unregister"]

Stamp = Callable[[], Mapping[str, Any]]
_stamps: list[Stamp] = []


def register(stamp: Stamp) -> None:
    """Call ``stamp`` at every enqueue from now on (once, however often registered)."""
    if stamp not in _stamps:
        _stamps.append(stamp)


def unregister(stamp: Stamp) -> None:
    if stamp in _stamps:
        _stamps.remove(stamp)


def registered() -> bool:
    return bool(_stamps)


def current() -> dict[str, Any]:
    """The registered stamps' values now (later stamps win a column)."""
    values: dict[str, Any] = {}
    for stamp in list(_stamps):
        values.update(stamp())
    return values


def fill(rows: Iterable[MutableMapping[str, Any]]) -> None:
    """Give each row (by column name) the stamps' values it has none of;
    the stamps are called once for all the rows of one enqueue call."""
    if not _stamps:
        return
    values = current()
    for row in rows:
        for name, value in values.items():
            if row.get(name) is None:
                row[name] = value
