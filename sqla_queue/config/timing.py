"""When a routine runs: the seed's minute lists, cron strings, fixed periods.

Each schedule names *fire times*; the span from one fire time to the next is
a **slot**, and a routine runs at most once per slot across all the workers
of a queue (the scheduler takes the routine's lock for the slot). Three
forms, all evaluated in UTC on the scheduler's clock:

- ``0,5,10`` — the seed's ``QUEUE_MINUTE_*_THREAD`` lists: at second 0 of
  these minutes of every hour. The reference ran up to four times in each
  listed minute (it woke every 15 s); here it is once.
- ``*/7 * * * *`` — a cron string (5 fields, or 6 with seconds first),
  parsed and evaluated by cronsim: small, without dependencies, and tested
  by its authors against Debian's cron on a large corpus of expressions.
- ``@every 15s`` (``s``, ``m`` or ``h``) — a fixed period, aligned on the
  epoch so that every worker agrees on where slots begin.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Protocol

from cronsim import CronSim, CronSimError

from ..common.exceptions import ConfigurationError

__all__ = ["Cron", "Every", "Minutes", "Schedule", "parse_schedule"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MINUTE_LIST = re.compile(r"\s*[0-9]+(\s*,\s*[0-9]+)*\s*")
_EVERY = re.compile(r"\s*@every\s+([0-9]+(?:\.[0-9]+)?)\s*([smh])\s*", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
#: a period longer than a day is better said with a cron string
EVERY_MAX_SECONDS = 24 * 3600
#: shorter periods would make the lock itself the load
EVERY_MIN_SECONDS = 0.5
_TINY = dt.timedelta(microseconds=1)


class Schedule(Protocol):
    def next_after(self, when: dt.datetime) -> dt.datetime:
        """The first fire time strictly after ``when``."""
        ...

    def slot_at(self, when: dt.datetime) -> dt.datetime:
        """The latest fire time at or before ``when``: the slot ``when`` is in."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Every:
    seconds: float

    def next_after(self, when: dt.datetime) -> dt.datetime:
        return self.slot_at(when) + dt.timedelta(seconds=self.seconds)

    def slot_at(self, when: dt.datetime) -> dt.datetime:
        elapsed = (when - _EPOCH).total_seconds()
        return _EPOCH + dt.timedelta(seconds=math.floor(elapsed / self.seconds) * self.seconds)

    def describe(self) -> str:
        seconds = self.seconds
        if seconds >= 3600 and seconds % 3600 == 0:
            return f"@every {int(seconds // 3600)}h"
        if seconds >= 60 and seconds % 60 == 0:
            return f"@every {int(seconds // 60)}m"
        return f"@every {seconds:g}s"


@dataclass(frozen=True)
class Minutes:
    """The seed's minute list: second 0 of these minutes, every hour."""

    minutes: tuple[int, ...]

    def next_after(self, when: dt.datetime) -> dt.datetime:
        hour = when.replace(minute=0, second=0, microsecond=0)
        for offset in (0, 1):
            start = hour + dt.timedelta(hours=offset)
            for minute in self.minutes:
                fire = start.replace(minute=minute)
                if fire > when:
                    return fire
        raise AssertionError("unreachable: a minute list is never empty")

    def slot_at(self, when: dt.datetime) -> dt.datetime:
        hour = when.replace(minute=0, second=0, microsecond=0)
        for offset in (0, -1):
            start = hour + dt.timedelta(hours=offset)
            for minute in reversed(self.minutes):
                fire = start.replace(minute=minute)
                if fire <= when:
                    return fire
        raise AssertionError("unreachable: a minute list is never empty")

    def describe(self) -> str:
        return ",".join(str(minute) for minute in self.minutes)


@dataclass(frozen=True)
class Cron:
    expression: str

    def next_after(self, when: dt.datetime) -> dt.datetime:
        return next(CronSim(self.expression, _utc(when)))

    def slot_at(self, when: dt.datetime) -> dt.datetime:
        # CronSim's reverse iteration yields times strictly before its start
        return next(CronSim(self.expression, _utc(when) + _TINY, reverse=True))

    def describe(self) -> str:
        return self.expression


def _utc(when: dt.datetime) -> dt.datetime:
    return when.astimezone(dt.timezone.utc)


def parse_schedule(text: object, name: str) -> Schedule:
    """A schedule from its text; a ConfigurationError naming ``name`` (the
    variable, table row or attribute it came from) when it is not one."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(
            f"{name} must be a minute list (0,15,30,45), a cron string or @every Ns, not {text!r}"
        )
    if _MINUTE_LIST.fullmatch(text):
        minutes = sorted({int(part) for part in text.split(",")})
        if minutes[-1] > 59:
            raise ConfigurationError(
                f"{name} must list minutes from 0 to 59 (the seed's form), not {text!r}"
            )
        return Minutes(tuple(minutes))
    every = _EVERY.fullmatch(text)
    if every is not None:
        seconds = float(every.group(1)) * _UNIT_SECONDS[every.group(2).lower()]
        if not EVERY_MIN_SECONDS <= seconds <= EVERY_MAX_SECONDS:
            raise ConfigurationError(
                f"{name} must be @every {EVERY_MIN_SECONDS:g}s to @every 24h "
                f"(use a cron string for longer periods), not {text!r}"
            )
        return Every(seconds)
    if text.strip().startswith("@"):
        raise ConfigurationError(f"{name} must be @every N followed by s, m or h, not {text!r}")
    try:
        CronSim(text.strip(), _EPOCH)
    except (CronSimError, ValueError) as exc:
        raise ConfigurationError(f"{name} is not a valid cron string ({exc}): {text!r}") from None
    return Cron(" ".join(text.split()))
