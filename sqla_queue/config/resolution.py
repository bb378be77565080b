"""Resolution: every setting of the catalogue, its value and where it came from.

Precedence, highest first: an explicit argument (the worker class's
attribute, or a value given to ``run()``), the environment (as read into
:class:`~sqla_queue.config.settings.Settings`), the ``queue_configuration`` table,
the default. The catalogue (``sqla_queue.config.catalog``) says what each setting
is; this module, above it and above the settings, decides its value, and
prints the result for ``sqla-queue config show``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .catalog import CATALOGUE, PEQ_UNUSED, Setting
from .kinds import Number
from .sources import QueueEnvironment, TableRow, check_table, table_value

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["Effective", "Resolved", "resolve", "show"]


@dataclass(frozen=True)
class Resolved:
    value: Any
    #: where it came from: "default", a variable, "queue_configuration.x", "Class.attr"
    source: str


@dataclass(frozen=True)
class Effective:
    """The value and the source of every setting resolved here."""

    values: Mapping[str, Resolved]
    #: table rows accepted but not used (PEQ's settings sqla-queue lacks)
    unused: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key].value

    def source(self, key: str) -> str:
        return self.values[key].source


def resolve(
    worker_class: type | None,
    settings: Settings,
    rows: Mapping[str, TableRow] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
) -> Effective:
    """Every resolved setting's value: ``overrides`` (explicit arguments)
    and the worker class's attributes, then the environment (as read into
    ``settings``), then the ``queue_configuration`` rows, then the default."""
    rows = rows or {}
    check_table(rows)
    environment = settings.environment
    values: dict[str, Resolved] = {}
    for entry in CATALOGUE:
        if not entry.resolved:
            continue
        values[entry.key] = _resolve_one(
            entry, worker_class, settings, environment, rows, overrides
        )
    unused = {name: PEQ_UNUSED[name] for name in rows if name in PEQ_UNUSED}
    return Effective(values, unused)


def _resolve_one(
    entry: Setting,
    worker_class: type | None,
    settings: Settings,
    environment: QueueEnvironment,
    rows: Mapping[str, TableRow],
    overrides: Mapping[str, Any] | None,
) -> Resolved:
    assert entry.kind is not None
    if overrides and entry.key in overrides:
        return Resolved(entry.kind.check(entry.key, overrides[entry.key]), "argument")
    if worker_class is not None and entry.attribute is not None:
        value = getattr(worker_class, entry.attribute, None)
        if value is not None:
            name = f"{worker_class.__name__}.{entry.attribute}"
            return Resolved(entry.kind.check(name, value), name)
    if entry.key in environment.parsed:
        value, variable = environment.parsed[entry.key]
        return Resolved(value, variable)
    if entry.settings_field is not None and entry.key in environment.present:
        return Resolved(getattr(settings, entry.settings_field), environment.present[entry.key])
    for name in entry.table:
        row = rows.get(name)
        if row is not None:
            return Resolved(table_value(entry, row), row.label)
    if entry.settings_field is not None:
        value = getattr(settings, entry.settings_field)
        changed = value != entry.default
        return Resolved(value, "Settings()" if changed else "default")
    default = entry.default
    return Resolved(
        entry.kind.parse(entry.key, default) if isinstance(default, str) else default, "default"
    )


def show(
    effective: Effective,
    settings: Settings,
    *,
    given: Mapping[str, str] | None = None,
    width: int = 34,
) -> Iterable[str]:
    """Lines of ``sqla-queue config show``: every setting, its value (with
    its unit), its source. ``given``: the values the command line gave
    (``{"url": ...}`` for ``--url``, shown as given, source ``--url``)."""
    given = given or {}
    for entry in CATALOGUE:
        value: Any
        if entry.key in given:
            value, source = given[entry.key], f"--{entry.key}"
        elif entry.resolved:
            resolved = effective.values[entry.key]
            value = resolved.value
            source = resolved.source
            if hasattr(value, "describe"):
                value = value.describe()
            elif value is None:
                value = (entry.default_text or "none").replace("`", "")
        else:
            variable = settings.environment.present.get(entry.key)
            source = variable or "default"
            value = "(set)" if variable else entry.show_default()
            if entry.secret and variable:
                value = "***"
            elif variable:
                value = os.environ.get(variable, "(set)")
        if entry.status != "used":
            source = f"{source}; {entry.status}"
        yield f"{entry.key:<{width}} {_with_unit(entry, value)!s:<30} {source}"
    for name, why in effective.unused.items():
        yield f"{name:<{width}} {'(in the table)':<30} queue_configuration; not used: {why}"


def _with_unit(entry: Setting, value: Any) -> Any:
    """A number of a setting that has a unit, with it: ``30 seconds``."""
    unit = entry.kind.allowed.unit if isinstance(entry.kind, Number) else ""
    if not unit or isinstance(value, bool):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):  # none, a word
        return value
    return f"{int(number) if number.is_integer() else number} {unit}"
