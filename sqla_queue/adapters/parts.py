"""What the parts of an adapter (its statements beside it: ``actions``,
``inspection``, ``limits``, ``maintenance``) use of the adapter that owns
them. A protocol rather than ``Adapter`` itself: ``base.py`` builds the
parts, so they cannot import it back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Table
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["PartOwner"]


class PartOwner(Protocol):
    """The adapter, as its parts see it."""

    table: Table

    @property
    def skip_locked(self) -> bool: ...

    def clock(self) -> ColumnElement[dt.datetime]: ...

    def id_match(self, column: Any, name: str) -> ColumnElement[bool]: ...

    def id_chunks(self, ids: Sequence[int]) -> list[list[int]]: ...

    def rows_insert_many(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
    ) -> None: ...

    def force_index(self, statement: Any, index: str) -> Any: ...
