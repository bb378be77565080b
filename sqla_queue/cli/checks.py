"""What the commands take in and give out: every number of the command
line checked against its range (sqla_queue.config.ranges), and every text that
comes from the database or another server escaped before a terminal gets
it (sqla_queue.common.redaction.escape_controls).

A number out of range (``--task 9223372036854775808``, ``--window 1e400d``,
``nan``, ``inf``, a negative one, 0 where it means nothing) is click's
usage error: one ``Error:`` line naming the option, exit status 2, before
anything connects to a database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import click

from ..common.redaction import escape_controls
from ..config.ranges import Range

__all__ = ["CommandError", "Duration", "Number", "Timestamp", "shown"]


def shown(value: object, *, multiline: bool = False) -> str:
    """``value`` as text a terminal prints as it is (None: ``""``)."""
    return "" if value is None else escape_controls(str(value), multiline=multiline)


class CommandError(click.ClickException):
    """One ``Error:`` line and exit status 1, its text escaped (it may quote
    a stored value, a database's or a server's error)."""

    def __init__(self, message: str) -> None:
        super().__init__(escape_controls(message))


class Number(click.ParamType):  # type: ignore[type-arg]
    """A whole number or a number within ``range``; a float's NaN and
    infinities, and an integer too big for the database, are out of it."""

    def __init__(self, range_: Range) -> None:
        self.range = range_
        self.name = "integer" if range_.integer else "float"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number: object = value
        if isinstance(value, str):
            text = value.strip()
            try:
                number = int(text) if self.range.integer else float(text)
            except ValueError:
                self.fail(f"{value!r} is not {self.range.describe()}", param, ctx)
        if not self.range.contains(number):
            self.fail(f"{value!r} is not {self.range.describe()}", param, ctx)
        return number


class Duration(click.ParamType):  # type: ignore[type-arg]
    """``90``, ``90s``, ``15m``, ``2h``, ``7d``, within ``range`` (seconds)."""

    name = "duration"
    _UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def __init__(self, range_: Range) -> None:
        self.range = range_

    def convert(self, value: Any, param: Any, ctx: Any) -> dt.timedelta:
        if isinstance(value, dt.timedelta):
            return value
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in self._UNITS else "s"
        number = text[:-1] if text[-1:] in self._UNITS else text
        try:
            seconds = float(number) * self._UNITS[unit]
        except ValueError:
            seconds = float("nan")
        if not self.range.contains(seconds):
            low, high = _span(self.range.low), _span(self.range.high)
            above = "more than" if self.range.low_open else "from"
            self.fail(
                f"{value!r} is not a duration {above} {low} to {high} (90, 90s, 15m, 2h, 7d)",
                param,
                ctx,
            )
        return dt.timedelta(seconds=seconds)


def _span(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{int(seconds // 86400)} d"
    return f"{int(seconds)} s" if float(seconds).is_integer() else f"{seconds} s"


class Timestamp(click.ParamType):  # type: ignore[type-arg]
    """An ISO 8601 time, UTC unless it says otherwise; one that is not a
    time in UTC (``0001-01-01T00:00+01:00``) is refused."""

    name = "timestamp"

    def convert(self, value: Any, param: Any, ctx: Any) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            parsed = dt.datetime.fromisoformat(str(value).strip())
            if parsed.tzinfo is None:
                return parsed.replace(tzinfo=dt.timezone.utc)
            return parsed.astimezone(dt.timezone.utc)
        except (ValueError, OverflowError):
            self.fail(
                f"{value!r} is not an ISO 8601 time (2026-01-31 or 2026-01-31T12:00)", param, ctx
            )
