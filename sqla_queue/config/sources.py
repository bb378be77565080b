"""Where a setting's value comes from besides the defaults: the environment
(``QueueEnvironment``) and the ``queue_configuration`` table (``TableRow``,
its units, its checks), each checked against the catalogue."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.exceptions import ConfigurationError
from .catalog import _BY_TABLE_NAME, CATALOGUE, PEQ_UNUSED, Setting
from .kinds import PLAIN_UNITS, UNIT_SECONDS, Number


# ---------------------------------------------------------------- the environment
@dataclass(frozen=True)
class QueueEnvironment:
    """The catalogue's variables as the environment set them, checked.

    ``parsed``: key -> (value, variable) for the settings resolved here;
    ``present``: key -> variable for every catalogue setting set at all."""

    parsed: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    present: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> QueueEnvironment:
        env = os.environ if env is None else env
        parsed: dict[str, tuple[Any, str]] = {}
        present: dict[str, str] = {}
        for entry in CATALOGUE:
            variable = next((name for name in entry.env if env.get(name) not in (None, "")), None)
            if variable is None:
                continue
            present[entry.key] = variable
            if entry.resolved and entry.kind is not None and entry.settings_field is None:
                parsed[entry.key] = (entry.kind.parse(variable, env[variable]), variable)
        return cls(parsed, present)


# ---------------------------------------------------------------- the table
SCHEMA_WIDE = "*"
"""``queue_name`` of a configuration row that applies to every queue reading
the table (written only when asked for: docs/configuration.md)."""


@dataclass(frozen=True)
class TableRow:
    """One row of ``queue_configuration`` (PEQ's columns)."""

    setting_name: str
    value: str | None
    unit: str | None = None
    casted_as: str | None = None
    note: str | None = None
    #: the row's ``queue_name``: a queue table's name, SCHEMA_WIDE, or None
    #: (a table without the column: every row applies to every queue)
    scope: str | None = None

    @property
    def label(self) -> str:
        """Where a value from this row comes from, as ``config show`` says it."""
        where = "" if self.scope is None else f"[{self.scope}]"
        return f"queue_configuration{where}.{self.setting_name}"


def table_value(entry: Setting, row: TableRow) -> Any:
    name = f"queue_configuration.{row.setting_name}"
    assert entry.kind is not None
    raw = "" if row.value is None else str(row.value).strip()
    unit = (row.unit or "").strip().lower()
    singular = unit[:-1] if unit.endswith("s") else unit
    if unit not in PLAIN_UNITS and singular not in UNIT_SECONDS:
        raise ConfigurationError(
            f"{name} has unit {row.unit!r}: use one of years, months, days, hours, minutes, "
            "seconds (or number, count, cron)"
        )
    native = entry.kind.time_unit
    if singular in UNIT_SECONDS:
        if native is None:
            raise ConfigurationError(f"{name} is not a duration; its unit cannot be {row.unit!r}")
        written = f"{raw} {row.unit}"
        try:
            number = float(raw)
        except ValueError:
            raise ConfigurationError(
                f"{name} must be {entry.kind.describe()}, not {written!r}"
            ) from None
        if not math.isfinite(number):
            raise ConfigurationError(f"{name} must be {entry.kind.describe()}, not {written!r}")
        converted = number * UNIT_SECONDS[singular] / UNIT_SECONDS[native]
        kind = entry.kind
        assert isinstance(kind, Number)
        if kind.allowed.integer and converted.is_integer():
            converted = int(converted)
        try:
            return kind.check(name, converted)
        except ConfigurationError:
            raise ConfigurationError(f"{name} must be {kind.describe()}, not {written!r}") from None
    return entry.kind.parse(name, raw)


#: rows of the configuration table that hold state, not settings: the rate
#: limits' token buckets (``rate:<hash of queue and process>``, limits.py),
#: the routine locks' leases (``routine_lock:<routine>``, adapters/locks.py)
STATE_PREFIXES = ("rate:", "routine_lock:")


def check_table(rows: Mapping[str, TableRow]) -> None:
    """Refuse unknown setting names (a typo would be silently ignored) and
    bad values, also those that a higher source overrides."""
    for name, row in rows.items():
        entry = _BY_TABLE_NAME.get(name)
        if entry is not None:
            table_value(entry, row)
        elif name not in PEQ_UNUSED and not name.startswith(STATE_PREFIXES):
            known = ", ".join(sorted(_BY_TABLE_NAME))
            raise ConfigurationError(
                f"queue_configuration has an unknown setting {name!r} (known: {known})"
            )


def check_attributes(worker_class: type) -> None:
    """The worker class's attributes of the catalogue: right type and range,
    or one ConfigurationError naming ``Class.attribute``."""
    for entry in CATALOGUE:
        if entry.attribute is None or entry.kind is None:
            continue
        value = getattr(worker_class, entry.attribute, None)
        if value is not None:
            entry.kind.check(f"{worker_class.__name__}.{entry.attribute}", value)
