"""The values a task is enqueued with, checked before its INSERT.

PostgreSQL and MariaDB refuse a value that does not fit its column (text
longer than the ``varchar``, a number out of range, text where a number
goes), each with its own driver error, once the INSERT reaches them; SQLite
stores it. So every enqueue path (the flush hook, the ORM bulk INSERT,
``QueueClient``) checks the columns the seed's ``insert_task`` sets, the
same way on every database, before it writes anything: a value that cannot
be stored raises :class:`InvalidTaskError`, one line that starts with the
column's name (``prioridade (priority): ...``), and the caller's transaction
is theirs to roll back with nothing of the task in it. The payload is
checked where it is serialised (``payload.py``).

What a database accepts for an integer column is accepted here too and
stored as that number: the text of a whole number (``"10"``) or a whole
float (``10.0``). ``True`` and ``False`` are not numbers here.

The enqueue is a hot path (docs/benchmarks.md): the checks are a type test
and, for text, ``len()`` and ``str.isascii()`` on the value; the limits are
read from the model's columns once, at import.
"""

from __future__ import annotations

import datetime as dt
import decimal
import operator
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.sql import ClauseElement

from ..common.exceptions import InvalidTaskError
from .mixins import QueueMixin

__all__ = ["ENQUEUE_FIELDS", "check_attributes", "check_columns"]


@dataclass(frozen=True)
class Field:
    #: the model's attribute (``priority``)
    attribute: str
    #: the seed column (``prioridade``), QueueClient's parameter name
    column: str
    check: Callable[[Field, Any], Any]
    #: characters for text, the largest value for a whole number
    limit: int

    @property
    def label(self) -> str:
        return self.column if self.column == self.attribute else f"{self.column} ({self.attribute})"

    def refuse(self, problem: str) -> InvalidTaskError:
        return InvalidTaskError(f"{self.label}: {problem}", column=self.column, problem=problem)


def _shown(value: Any) -> str:
    """A bad value in a message: its type and the start of its repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"


def _text(field: Field, value: Any) -> Any:
    if not isinstance(value, str):
        return value  # the driver's to convert (an int chave_externa)
    if len(value) > field.limit:
        raise field.refuse(f"{len(value)} characters, and the column holds at most {field.limit}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise field.refuse(
                f"a lone surrogate (U+{ord(value[exc.start]):04X}) at character {exc.start} "
                "is not Unicode text and cannot be stored"
            ) from None
    return value


def _whole_number(field: Field, value: Any) -> Any:
    if type(value) is not int:
        value = _as_int(field, value)
    if not -field.limit - 1 <= value <= field.limit:
        raise field.refuse(
            f"{value} is out of the column's range ({-field.limit - 1} to {field.limit})"
        )
    return value


def _as_int(field: Field, value: Any) -> int:
    if isinstance(value, bool):
        raise field.refuse(f"expected a whole number, got {_shown(value)}")
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
    elif isinstance(value, decimal.Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
    elif isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    elif hasattr(type(value), "__index__"):
        return operator.index(value)  # an int subclass, numpy's integers
    raise field.refuse(f"expected a whole number, got {_shown(value)}")


def _time(field: Field, value: Any) -> Any:
    if not isinstance(value, dt.datetime):
        raise field.refuse(f"expected a datetime, got {_shown(value)}")
    return value


def _field(attribute: str) -> Field:
    column = getattr(QueueMixin, attribute).column
    kind = column.type
    if isinstance(kind, String):
        assert kind.length is not None
        return Field(attribute, column.name, _text, kind.length)
    if isinstance(kind, (Integer, BigInteger)):
        bits = 63 if isinstance(kind, BigInteger) else 31
        return Field(attribute, column.name, _whole_number, 2**bits - 1)
    return Field(attribute, column.name, _time, 0)


#: the columns the seed's insert_task sets, but the payload
ENQUEUE_FIELDS = tuple(
    _field(attribute)
    for attribute in (
        "origin",
        "destination",
        "process",
        "external_key",
        "tenant",
        "company_group",
        "run_at",
        "priority",
    )
)

_BY_COLUMN = {field.column: field for field in ENQUEUE_FIELDS}


def check_attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check a new task's values by attribute name (a model instance's
    ``__dict__``, an ORM INSERT's parameters); the values to store instead
    (a whole number given as text), by attribute name. An SQL expression is
    the database's to check."""
    changed: dict[str, Any] = {}
    for field in ENQUEUE_FIELDS:
        value = values.get(field.attribute)
        if value is None:
            continue
        try:
            checked = field.check(field, value)
        except InvalidTaskError:
            if isinstance(value, ClauseElement):
                continue  # looked at only when refused: the common values pay nothing
            raise
        if checked is not value:
            changed[field.attribute] = checked
    return changed


def check_columns(values: MutableMapping[str, Any]) -> None:
    """Check QueueClient's parameters by seed name, in place (the values
    given, not every field: on every enqueue's path)."""
    for column, value in values.items():
        if value is not None:
            field = _BY_COLUMN.get(column)
            if field is not None:
                checked = field.check(field, value)
                if checked is not value:
                    values[column] = checked  # an existing key: the iteration holds
