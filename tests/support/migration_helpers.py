"""Private databases for the migration tests (alembic and ``sqla-queue ddl``).

Autogenerate compares the metadata with *every* table of a database, and
other suites create and drop tables in the shared ``test`` databases all the
time: each test here gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from sqla_queue.config.settings import normalize_url
from tests.conftest import server_url


@contextlib.contextmanager
def private_database(kind: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty database of ``kind`` (sqlite, postgresql,
    mysql), dropped on the way out."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / f'private_{uuid.uuid4().hex[:8]}.db'}"
        return
    name = f"sqlaq_mig_{uuid.uuid4().hex[:10]}"
    server = normalize_url(server_url(kind))
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            if kind == "postgresql":
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def schema_snapshot(url: str) -> dict[str, Any]:
    """Tables, columns and indexes as the inspector sees them (everything
    but alembic's own table), to compare two databases."""
    engine = create_engine(normalize_url(url))
    try:
        inspector = inspect(engine)
        snapshot: dict[str, Any] = {}
        for table in sorted(set(inspector.get_table_names()) - {"alembic_version"}):
            columns = [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                for c in inspector.get_columns(table)
            ]
            indexes = sorted(
                (
                    str(index["name"]),
                    tuple(str(name) for name in index["column_names"]),
                    tuple(str(e) for e in index.get("expressions") or ()),
                    repr(
                        sorted((k, str(v)) for k, v in (index.get("dialect_options") or {}).items())
                    ),
                    repr(sorted((index.get("column_sorting") or {}).items())),
                )
                for index in inspector.get_indexes(table)
            )
            snapshot[table] = {"columns": columns, "indexes": indexes}
        return snapshot
    finally:
        engine.dispose()
