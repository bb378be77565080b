"""The kinds of value a setting takes (docs/configuration.md): numbers in a
range, flags, choices, schedules, text; each parses what a user wrote and
says in one line what was wrong."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..common.exceptions import ConfigurationError
from .ranges import Range

#: the ``unit`` column's values (PostgreSQL interval units, and PEQ's others)
UNIT_SECONDS = {
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "month": 30 * 86400.0,
    "year": 365 * 86400.0,
}
PLAIN_UNITS = ("", "number", "count", "integer", "string", "text", "cron", "boolean")


class Kind:
    """How a setting's text becomes its value, and what it accepts."""

    #: the native time unit, for the table's unit column (None: not a time)
    time_unit: str | None = None

    def parse(self, name: str, raw: str) -> Any:
        raise NotImplementedError

    def check(self, name: str, value: Any) -> Any:
        """A value given in Python (a class attribute, an argument)."""
        return self.parse(name, value) if isinstance(value, str) else value

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Number(Kind):
    allowed: Range
    #: words that mean "none" (an optional setting), in any case
    none_words: tuple[str, ...] = ()

    @property
    def time_unit(self) -> str | None:  # type: ignore[override]
        unit = self.allowed.unit
        return unit.rstrip("s") if unit.rstrip("s") in UNIT_SECONDS else None

    def parse(self, name: str, raw: str) -> Any:
        if raw.strip().lower() in self.none_words:
            return None
        try:
            value: float = int(raw) if self.allowed.integer else float(raw)
        except ValueError:
            raise ConfigurationError(f"{name} must be {self.describe()}, not {raw!r}") from None
        if not self.allowed.contains(value):
            raise ConfigurationError(f"{name} must be {self.describe()}, not {raw!r}")
        return value

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.none_words:
            return None
        if not self.allowed.contains(value):
            raise ConfigurationError(f"{name} must be {self.describe()}, not {value!r}")
        return value

    def describe(self) -> str:
        text = self.allowed.describe()
        return f"{text}, or {self.none_words[0]}" if self.none_words else text


@dataclass(frozen=True)
class Flag(Kind):
    def parse(self, name: str, raw: str) -> Any:
        value = raw.strip().lower()
        if value in ("true", "1", "yes", "on"):
            return True
        if value in ("false", "0", "no", "off"):
            return False
        raise ConfigurationError(f"{name} must be true or false, not {raw!r}")

    def check(self, name: str, value: Any) -> Any:
        if value is True or value is False:
            return value
        raise ConfigurationError(f"{name} must be True or False, not {value!r}")

    def describe(self) -> str:
        return "true or false"


class EnvFlag:
    """A true/false environment variable read where it is used, on every use
    (cheaply: parsed once per value), so a change takes effect at once; a
    value that is not a boolean is a ``ConfigurationError`` naming it."""

    __slots__ = ("default", "key", "last", "name")

    def __init__(self, name: str, *, default: bool) -> None:
        self.name = name
        self.default = default
        self.last: tuple[Any, bool] = (None, default)
        #: the name as ``os.environ`` keeps it (see ``_ENVIRON_VALUE`` below)
        self.key = _ENVIRON_KEY(name)

    def __call__(self) -> bool:
        raw = _ENVIRON_VALUE(self.key)
        if raw is None:
            return self.default
        if raw != self.last[0]:
            value = _ENVIRON_DECODE(raw)
            self.last = (raw, bool(Flag().parse(self.name, value)))
        return self.last[1]


# ``os.environ.get`` of a variable that is not set raises and catches a
# KeyError inside: a microsecond on every enqueue. ``os.environ`` keeps its
# encoded items in a plain dict, which its own setters (``monkeypatch`` and
# ``os.environ[...] = ...`` included) keep current: read there when it has one.
_environ_data = getattr(os.environ, "_data", None)
if isinstance(_environ_data, dict) and callable(getattr(os.environ, "encodekey", None)):
    _ENVIRON_KEY = os.environ.encodekey  # type: ignore[attr-defined]
    _ENVIRON_VALUE = _environ_data.get
    _ENVIRON_DECODE = os.environ.decodevalue  # type: ignore[attr-defined]
else:  # pragma: no cover - another Python's os.environ
    _ENVIRON_KEY = str
    _ENVIRON_VALUE = os.environ.get
    _ENVIRON_DECODE = str


@dataclass(frozen=True)
class Choice(Kind):
    options: tuple[str, ...]

    def parse(self, name: str, raw: str) -> Any:
        value = raw.strip().lower() if isinstance(raw, str) else raw
        if value not in self.options:
            raise ConfigurationError(f"{name} must be {self.describe()}, not {raw!r}")
        return value

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise ConfigurationError(f"{name} must be {self.describe()}, not {value!r}")
        return self.parse(name, value)

    def describe(self) -> str:
        return " or ".join(self.options)


@dataclass(frozen=True)
class ScheduleKind(Kind):
    def parse(self, name: str, raw: str) -> Any:
        from .timing import parse_schedule

        return parse_schedule(raw, name)

    def check(self, name: str, value: Any) -> Any:
        return self.parse(name, value)

    def describe(self) -> str:
        return "minutes (0,30), a cron string (*/7 * * * *) or @every 15s"


@dataclass(frozen=True)
class Text(Kind):
    def parse(self, name: str, raw: str) -> Any:
        return raw

    def describe(self) -> str:
        return "text"
