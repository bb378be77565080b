"""Bad enqueue values: one clear line naming the field, and nothing stored.

Each bad value goes through every enqueue path (the flush hook's fast
INSERT and the ORM's unit of work, the ORM bulk INSERT, ``insert_task``,
``insert_tasks`` and, on PostgreSQL, ``copy_tasks``), on SQLite, PostgreSQL
and MariaDB, inside a transaction that enqueued a good task first: the call
raises a ``ValueError`` of sqla-queue's whose one-line message names the
field, and once the caller's transaction has rolled back the table is empty.
The check happens before any INSERT, so SQLite refuses what PostgreSQL and
MariaDB refuse.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, insert, select
from sqlalchemy.orm import Session

from sqla_queue import InvalidTaskError, PayloadError, QueueClient
from sqla_queue.mixins import COLUMN_NAMES
from tests.support.app import App

UTC = dt.timezone.utc
#: English attribute names, which QueueClient takes as keyword aliases too
GOOD = {"process": "faturar", "external_key": "7", "payload": {"invoice": 7}}

#: the seed column of each attribute: the error message starts with it
COLUMNS = {**COLUMN_NAMES, "payload": "payload"}
#: (attribute, bad value)
BAD_VALUES: list[tuple[str, Any]] = [
    ("payload", "texto \ud800 solto"),
    ("payload", {"cliente": "Jo\udc00o"}),
    ("payload", ["\ud83d"]),
    ("run_at", "2030-01-01T00:00:00"),
    ("run_at", dt.date(2030, 1, 1)),
    ("priority", "abc"),
    ("priority", float("nan")),
    ("priority", 2**31),
    ("priority", True),
    ("tenant", "abc"),
    ("tenant", 1.5),
    ("tenant", decimal.Decimal("NaN")),
    ("tenant", 2**63),
    ("process", "p" * 251),
    ("external_key", "k" * 101),
    ("origin", "o" * 151),
    ("destination", "d" * 151),
    ("company_group", "g" * 41),
    ("process", "fatur\udfffar"),
]


def _count(engine: Engine, app: App) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(app.Task)).scalar_one()


def _orm_add(session: Session, app: App, values: dict[str, Any]) -> None:
    session.add(app.Task(**values))
    session.flush()


def _orm_bulk(session: Session, app: App, values: dict[str, Any]) -> None:
    session.execute(insert(app.Task), [GOOD, values])


def _insert_task(session: Session, app: App, values: dict[str, Any]) -> None:
    QueueClient(session, app.Task).insert_task(**values)


def _insert_tasks(session: Session, app: App, values: dict[str, Any]) -> None:
    QueueClient(session, app.Task).insert_tasks([GOOD, values])


def _copy_tasks(session: Session, app: App, values: dict[str, Any]) -> None:
    QueueClient(session, app.Task).copy_tasks([GOOD, values])


PATHS: dict[str, Callable[[Session, App, dict[str, Any]], None]] = {
    "session.add": _orm_add,
    "session.add-unit-of-work": _orm_add,
    "orm-bulk-insert": _orm_bulk,
    "insert_task": _insert_task,
    "insert_tasks": _insert_tasks,
    "copy_tasks": _copy_tasks,
}


def _refusal(engine: Engine, app: App, path: str, attribute: str, value: Any) -> str | None:
    """What is wrong with how ``path`` took the bad value (None: refused right)."""
    bad = {**GOOD, attribute: value}
    with Session(engine) as session:
        try:
            with session.begin():
                # a good task first: the caller's transaction has written something
                QueueClient(session, app.Task).insert_task(**GOOD)
                _orm_add(session, app, GOOD)
                PATHS[path](session, app, bad)
        except Exception as exc:  # the test reports what it got
            error: BaseException | None = exc
        else:
            error = None
    column = COLUMNS[attribute]
    expected = PayloadError if column == "payload" else InvalidTaskError
    left = _count(engine, app)
    if left:
        with engine.begin() as conn:
            conn.execute(delete(app.Task))
    message = "" if error is None else str(error)
    if (
        isinstance(error, expected)
        and isinstance(error, ValueError)
        and "\n" not in message
        and message.startswith(column)
        and not left
    ):
        return None
    return f"{type(error).__name__}: {message[:160]!r}, {left} row(s) left"


@pytest.mark.parametrize(
    ("db_url", "path"),
    [
        (kind, path)
        for kind in ("sqlite", "postgresql", "mysql")
        for path in PATHS
        if path != "copy_tasks" or kind == "postgresql"  # COPY is PostgreSQL's
    ],
    indirect=["db_url"],
)
def test_a_bad_value_is_one_line_naming_the_field_and_nothing_is_stored(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path == "session.add-unit-of-work":
        monkeypatch.setenv("SQLA_QUEUE_ORM_FAST_INSERT", "false")
    wrong = {
        f"{attribute}={value!r:.30}": problem
        for attribute, value in BAD_VALUES
        if (problem := _refusal(engine, app, path, attribute, value)) is not None
    }
    assert wrong == {}


def test_a_whole_number_given_another_way_is_stored_as_the_number(
    engine: Engine, app: App, installed: None
) -> None:
    """What the databases themselves accept for an integer column (the text
    of a whole number, a whole float) is stored as that number, on every path."""
    for attribute, value, stored in [
        ("priority", "10", 10),
        ("priority", 10.0, 10),
        ("priority", decimal.Decimal("10"), 10),
        ("tenant", " 47 ", 47),
        ("tenant", 2**63 - 1, 2**63 - 1),
    ]:
        given = {**GOOD, attribute: value}
        with Session(engine) as session, session.begin():
            _orm_add(session, app, given)
            session.execute(insert(app.Task), [given])
            QueueClient(session, app.Task).insert_task(**given)
            QueueClient(session, app.Task).insert_tasks([given])
        with engine.begin() as conn:
            column = getattr(app.Task, attribute)
            assert conn.execute(select(column)).scalars().all() == [stored] * 4
            conn.execute(delete(app.Task))


def test_text_at_the_column_length_and_non_bmp_payloads_are_stored(
    engine: Engine, app: App, installed: None
) -> None:
    """The limits are the columns': exactly 250 characters of processo fit,
    and a payload with characters outside the BMP (surrogate pairs in the
    JSON text) is not a lone surrogate."""
    given = {
        **GOOD,
        "process": "ç" * 250,
        "external_key": "k" * 100,
        "payload": {"clave": "𝄞", "texto": "C:\\ud800"},
    }
    with Session(engine) as session, session.begin():
        _orm_add(session, app, given)
        QueueClient(session, app.Task).insert_task(**{**given, "payload": "𝄞 \\ud800"})
    with Session(engine) as session:
        stored = session.scalars(select(app.Task).order_by(app.Task.id)).all()
    assert [task.payload for task in stored] == [given["payload"], "𝄞 \\ud800"]
    assert {len(task.process) for task in stored} == {250}
