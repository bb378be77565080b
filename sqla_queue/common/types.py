"""Column types and defaults that behave the same on every dialect.

Timestamps are aware UTC ``datetime`` values in Python everywhere. PostgreSQL
stores ``timestamptz``; MySQL, MariaDB, SingleStore and SQLite store naive
UTC (``DATETIME(6)`` / ISO text), converted on the way in and out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import TEXT, DateTime, LargeBinary
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator, TypeEngine

from . import ddl_singlestore  # noqa: F401  (registers SingleStore's CREATE TABLE options)
from .exceptions import UnpreparedTaskError
from .payload import PendingHash

MYSQL_FAMILY = frozenset({"mysql", "mariadb", "singlestoredb"})


def dialect_family(dialect: Dialect | str) -> str:
    """``postgresql``, ``mysql``, ``singlestore`` or ``sqlite``."""
    name = dialect if isinstance(dialect, str) else dialect.name
    if name == "singlestoredb":
        return "singlestore"
    if name in MYSQL_FAMILY:
        return "mysql"
    return name


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes in Python, on every dialect."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in MYSQL_FAMILY:
            # imported here: a PostgreSQL or SQLite worker never loads the MySQL dialect
            from sqlalchemy.dialects.mysql import DATETIME

            return DATETIME(fsp=6)
        return DateTime(timezone=True)

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        if dialect.name == "postgresql":
            return value
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


class PayloadText(TypeDecorator[str]):
    """TEXT; LONGTEXT on the MySQL family (TEXT stops at 64 KiB there)."""

    impl = TEXT
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in MYSQL_FAMILY:
            from sqlalchemy.dialects.mysql import LONGTEXT

            return LONGTEXT()
        return TEXT()


class PayloadHash(TypeDecorator[bytes]):
    """The hex digest's 64 ASCII bytes: bytea/BLOB, VARBINARY(64) on MySQL.

    A model instance holds a :class:`~sqla_queue.common.payload.PendingHash` here
    until the flush hook prepares it; binding one means the row skipped the
    hook (``session.bulk_save_objects()``), and it is refused."""

    impl = LargeBinary
    cache_ok = True
    #: exactly ``bytes`` binds as is (adapters/libpq.py): only a PendingHash is refused
    sqla_queue_binds_exact_as_is = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in MYSQL_FAMILY:
            from sqlalchemy.dialects.mysql import VARBINARY

            return VARBINARY(64)
        return LargeBinary()

    def process_bind_param(self, value: bytes | None, dialect: Dialect) -> bytes | None:
        if isinstance(value, PendingHash):
            raise UnpreparedTaskError()
        return value

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if dialect.driver == "aiomysql":
            return self._bind_as_text
        return super().bind_processor(dialect)

    def _bind_as_text(self, value: bytes | None) -> bytes | str | None:
        # aiomysql (0.3.2; the mysql extra installs asyncmy, users may name
        # aiomysql) escapes bytes with a PyMySQL helper that PyMySQL 1.2.3
        # replaced by a string: every bytes parameter fails
        # (aio-libs/aiomysql#1080). Sent as text, the digest's ASCII is
        # stored, and compared, as the same bytes by the VARBINARY column.
        if isinstance(value, PendingHash):
            raise UnpreparedTaskError()
        if value is not None and value.isascii():
            return value.decode("ascii")
        return value


class utc_now(FunctionElement[dt.datetime]):
    """The database's current time, in the form its queue columns store."""

    type = DateTime(timezone=True)
    inherit_cache = True
    name = "utc_now"


@compiles(utc_now)
def _utc_now_default(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(utc_now, "postgresql")
def _utc_now_pg(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    # clock_timestamp(), as the reference DDL: rows inserted late in a long
    # transaction are not dated at its start
    return "clock_timestamp()"


@compiles(utc_now, "mysql")
@compiles(utc_now, "mariadb")
def _utc_now_mysql(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "(UTC_TIMESTAMP(6))"


@compiles(utc_now, "singlestoredb")
def _utc_now_singlestore(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    # SingleStore runs in UTC and takes no expression defaults
    return "CURRENT_TIMESTAMP(6)"


@compiles(utc_now, "sqlite")
def _utc_now_sqlite(element: utc_now, compiler: SQLCompiler, **kw: Any) -> str:
    # the same text SQLAlchemy writes for a datetime: six fractional digits
    return "(strftime('%Y-%m-%d %H:%M:%f000', 'now'))"
