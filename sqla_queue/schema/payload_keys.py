"""Columns filled from a payload key at enqueue: claim fairly by a payload key.

A worker claims fairly by a column (``fair_by``, fairness.py), whose index
keeps the claim cheap on every dialect. To be fair by a key of the payload
(the customer of an order, a webhook's account), the model declares a
column for it with :func:`payload_key`, and every enqueue fills it from the
payload's top-level key::

    class Task(QueueMixin, Base):
        __tablename__ = "fila"
        __queue_fair_by__ = ("cliente",)
        cliente = payload_key("cliente_id")  # payload["cliente_id"], as text

    class Faturar(WorkerBase):
        model = Task
        fair_by = "payload.cliente_id"  # or "cliente", the column

The value is the key's value as text (a number's digits, ``true`` or
``false``, a string as is, anything else as compact JSON), NULL when the
payload is not an object or lacks the key; a value longer than the column
is a one-line ``ValueError`` at enqueue (cut, two customers would share a
key). A value given for the column itself is kept. The ORM flush hook, an
ORM ``insert(Task)``, ``QueueClient`` and ``AsyncQueueClient`` fill it;
retries, dead-letter runs and pub/sub copies carry it. Rows written by
other means (nsj-queue-lib's clients, SQL by hand, the Spark pipeline)
leave it NULL: their tasks are claimed as the tasks without a key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import String, Table
from sqlalchemy.orm import Mapper, mapped_column

from ..common.exceptions import ConfigurationError

__all__ = ["INFO_KEY", "attribute_plan", "column_of", "missing_values", "payload_key", "values_for"]

#: ``Column.info`` key naming the payload key a column is filled from
INFO_KEY = "sqla_queue_payload_key"
#: the longest payload key name
MAX_KEY_LENGTH = 200


def payload_key(key: str, *, length: int = 255) -> Any:
    """A column of the queue model filled at enqueue from the payload's
    top-level ``key`` (see the module); ``length``: its size in characters."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ConfigurationError(
            f"payload_key() takes the name of a top-level payload key (1 to "
            f"{MAX_KEY_LENGTH} characters), not {key!r}"
        )
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 4000:
        raise ConfigurationError(f"payload_key(length=...) must be 1 to 4000, not {length!r}")
    return mapped_column(String(length), nullable=True, info={INFO_KEY: key})


#: per table: (column name, payload key, length) of its payload-key columns
_columns: dict[Table, tuple[tuple[str, str, int], ...]] = {}
#: per mapper: (attribute key, payload key, length)
_attributes: dict[Mapper[Any], tuple[tuple[str, str, int], ...]] = {}


def _table_plan(table: Table) -> tuple[tuple[str, str, int], ...]:
    plan = _columns.get(table)
    if plan is None:
        plan = _columns[table] = tuple(
            (column.name, column.info[INFO_KEY], int(getattr(column.type, "length", 0) or 0))
            for column in table.c
            if INFO_KEY in column.info
        )
    return plan


def attribute_plan(mapper: Mapper[Any]) -> tuple[tuple[str, str, int], ...]:
    """(attribute key, payload key, length) of the mapper's payload-key
    columns (none, for most models)."""
    plan = _attributes.get(mapper)
    if plan is None:
        table = mapper.local_table
        columns = _table_plan(table) if isinstance(table, Table) else ()
        plan = _attributes[mapper] = tuple(
            (mapper.get_property_by_column(table.c[name]).key, key, length)
            for name, key, length in columns
        )
    return plan


def column_of(table: Table, key: str) -> str | None:
    """The column filled from payload key ``key``; None: none is."""
    for name, found, _ in _table_plan(table):
        if found == key:
            return name
    return None


def values_for(table: Table, payload: Any) -> dict[str, str | None]:
    """The payload-key columns' values (by column name) for a task of
    ``table`` with ``payload``; empty when the table has none."""
    plan = _table_plan(table)
    return missing_values(plan, payload, {}) if plan else {}


def missing_values(
    plan: tuple[tuple[str, str, int], ...], payload: Any, given: Mapping[str, Any]
) -> dict[str, str | None]:
    """The values from ``payload`` of the ``plan``'s columns (a
    :func:`attribute_plan` or a table's, by the plan's names) that ``given``
    (a task's values by the same names) leaves empty: a value given is kept."""
    return {
        name: text_of(payload, key, length) for name, key, length in plan if given.get(name) is None
    }


def text_of(payload: Any, key: str, length: int) -> str | None:
    """``payload[key]`` as the column stores it (see the module)."""
    if not isinstance(payload, Mapping):
        return None
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (str, int, float)):
        text = str(value)
    else:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    if length and len(text) > length:
        raise ValueError(
            f"payload key {key!r} holds {len(text)} characters: its column takes {length}"
        )
    return text
