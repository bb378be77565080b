"""Bad enqueue values: one clear line naming the field, and nothing stored.
Bad numbers on the command line: click's usage error, one line naming the
option, exit status 2 (at the end).

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
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, insert, select
from sqlalchemy.orm import Session

from sqla_queue import InvalidTaskError, PayloadError, QueueClient
from sqla_queue.schema.mixins import COLUMN_NAMES
from tests.conftest import run_cli
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


# ------------------------------------------------------------ the command line
WORKER = "tests.support.app:RecordingWorker"
BIGGEST_ID = str(2**63 - 1)
#: (command line, the option its one error line names): every number the
#: commands take, out of its range
#: what `sqla-queue spark enqueue` needs besides the number under test
SPARK_INPUT = ["in.parquet", "--table", "t", "--process", "p"]
BAD_NUMBERS: list[tuple[list[str], str]] = [
    *(
        (["status", WORKER, "--task", value], "--task")
        for value in ("9223372036854775808", "0", "-1", "1e3", "nan", "9" * 5000)
    ),
    *(
        (["status", WORKER, "--window", value], "--window")
        for value in ("1e400d", "nan", "inf", "-5m", "0", "0.5s", "36501d", "")
    ),
    *((["status", WORKER, "--interval", v], "--interval") for v in ("nan", "inf", "1e400", "0")),
    (["cancel", WORKER, "--task", "9223372036854775808"], "--task"),
    *(
        (["cancel", WORKER, "--process", "x", "--older-than", value], "--older-than")
        for value in ("1e400d", "nan", "-1s", "infd", "1e308d")
    ),
    (["retry-now", WORKER, "--task", "9" * 30], "--task"),
    (["retry-now", WORKER, "--task", "-5"], "--task"),
    (["requeue", WORKER, "--id", "9223372036854775808"], "--id"),
    *((["requeue", WORKER, "--all", "--limit", v], "--limit") for v in ("0", "1e400", "10001")),
    (["requeue", WORKER, "--all", "--since", "0001-01-01T00:00+01:00"], "--since"),
    (["worker", WORKER, "--concurrency", "9223372036854775808"], "--concurrency"),
    (["worker", WORKER, "--concurrency", "0"], "--concurrency"),
    (["worker", WORKER, "--batch-size", "10001"], "--batch-size"),
    *(
        (["worker", WORKER, "--commit-budget-ms", v], "--commit-budget-ms")
        for v in ("nan", "inf", "-1")
    ),
    (["worker", WORKER, "--metrics-port", "70000"], "--metrics-port"),
    (
        ["webhook", "--model", "a:B", "--subscriber-model", "a:C", "--concurrency", "nan"],
        "--concurrency",
    ),
    (["server", "--notify-port", "-1"], "--notify-port"),
    (["server", "--lock-port", "65536"], "--lock-port"),
    *(
        (["spark", "enqueue", *SPARK_INPUT, "--priority", v], "--priority")
        for v in ("2147483648", "1e400", "nan")
    ),
    *(
        (["spark", "report", "--table", "t", "--out", "o", option, v], option)
        for option, v in (("--partitions", "0"), ("--partitions", "1e400"), ("--slowest", "-1"))
    ),
    *(
        (["spark", "archive", "--table", "t", "--path", "p", option, v], option)
        for option, v in (
            ("--retention-days", "1e400"),
            ("--retention-days", "nan"),
            ("--retention-days", "-1"),
            ("--chunk-families", "0"),
            ("--partitions", "inf"),
        )
    ),
]


def _one_usage_error(code: int, stderr: str, option: str | None) -> str | None:
    """What is wrong with a refusal (None: exit status 2, click's usage
    text and one ``Error:`` line naming ``option``, no traceback)."""
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    if code != 2 or len(errors) != 1 or "Traceback" in stderr:
        return f"exit {code}: {stderr[-300:]!r}"
    if option is not None and f"'{option}'" not in errors[0]:
        return f"does not name {option}: {errors[0]!r}"
    return None


def test_every_number_of_the_command_line_is_range_checked() -> None:
    """Each one is click's usage error before anything connects (the same on
    every database: no --url is read). In-process, for the whole list; the
    test below runs the real command on each database."""
    from click.testing import CliRunner

    from sqla_queue.cli import main

    wrong = {}
    for args, option in BAD_NUMBERS:
        result = CliRunner().invoke(main, args)
        if not isinstance(result.exception, SystemExit):
            wrong[" ".join(args)[:80]] = repr(result.exception)
        elif (problem := _one_usage_error(result.exit_code, result.stderr, option)) is not None:
            wrong[" ".join(args)[:80]] = problem
    assert wrong == {}


def test_huge_numbers_on_every_database(engine: Engine, app: App, db_url: str) -> None:
    """The issue's command lines, and the biggest id there is (which reaches
    the database: one ``Error:`` line, exit status 1), and the longest
    window and age (a hundred years back, within every database's dates)."""
    env = {"SQLA_QUEUE_TEST_TABLE": app.Task.__tablename__}
    table = app.Task.__tablename__

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = run_cli(args[0], WORKER, "--url", db_url, *args[1:], env=env, check=False)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    for args, option in [
        (("status", "--task", "9223372036854775808"), "--task"),
        (("status", "--window", "1e400d"), "--window"),
        (("cancel", "--process", "x", "--older-than", "1e400d"), "--older-than"),
    ]:
        done = run(*args)
        assert _one_usage_error(done.returncode, done.stderr, option) is None, done.stderr
    missing = run("status", "--task", BIGGEST_ID)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"Error: no task {BIGGEST_ID} in {table}"
    for command in ("cancel", "retry-now"):
        refused = run(command, "--task", BIGGEST_ID)
        assert refused.returncode == 1
        assert refused.stderr.strip() == f"Error: no task {BIGGEST_ID} in {table}"
    none = run("requeue", "--id", BIGGEST_ID)
    assert none.returncode == 0 and none.stdout.strip() == "requeued 0 dead task(s)", none.stderr
    assert run("status", "--window", "36500d", "--json").returncode == 0
    old = run("cancel", "--process", "x", "--older-than", "36500d")
    assert old.returncode == 0 and old.stdout.strip() == "cancelled 0 waiting task(s) of x"
