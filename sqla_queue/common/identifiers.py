"""Validation of the names that end up inside SQL text.

Schema, table and channel names cannot be bound as parameters, so they are
checked against a conservative pattern before any SQL is built with them.
Values are always bound, never formatted into SQL.
"""

from __future__ import annotations

import re
import zlib

from .exceptions import InvalidIdentifierError

IDENTIFIER_MAX_LENGTH = 63  # PostgreSQL's NAMEDATALEN - 1; MySQL allows 64
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def validate_identifier(name: object, what: str = "identifier") -> str:
    """Return ``name`` if it is a plain SQL identifier, else raise."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError(
            f"invalid {what} {name!r}: use letters, digits and underscores, "
            "not starting with a digit"
        )
    if len(name) > IDENTIFIER_MAX_LENGTH:
        raise InvalidIdentifierError(
            f"invalid {what} {name!r}: longer than {IDENTIFIER_MAX_LENGTH} characters"
        )
    return name


def derived_identifier(base: str, suffix: str, prefix: str = "") -> str:
    """``prefix + base + "_" + suffix``, shortened to fit every dialect.

    Index, trigger and function names are built from the table name; a table
    name near the limit would push them past it (PostgreSQL would silently
    truncate some and refuse others, MySQL refuses). A long base is cut and
    a hash of the whole base keeps the name unique."""
    name = f"{prefix}{base}_{suffix}"
    if len(name) <= IDENTIFIER_MAX_LENGTH:
        return name
    digest = f"{zlib.crc32(base.encode()):08x}"
    room = IDENTIFIER_MAX_LENGTH - len(prefix) - len(suffix) - len(digest) - 2
    return f"{prefix}{base[:room]}_{digest}_{suffix}"


def split_table_name(qualified: str) -> tuple[str | None, str]:
    """``"schema.table"`` -> ``("schema", "table")``; both parts validated."""
    if not isinstance(qualified, str):
        raise InvalidIdentifierError(f"invalid table name {qualified!r}")
    schema, _, table = qualified.rpartition(".")
    return (
        validate_identifier(schema, "schema name") if schema else None,
        validate_identifier(table, "table name"),
    )


def lock_namespace(qualified_table: str, purpose: str) -> int:
    """A signed 32-bit number naming one kind of lock on one queue.

    Task locks and maintenance locks of different queues never share a key
    (the reference library used raw task ids for both)."""
    value = zlib.crc32(f"sqla_queue:{qualified_table}:{purpose}".encode())
    return value - (1 << 32) if value >= (1 << 31) else value
