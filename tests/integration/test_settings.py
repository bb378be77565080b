"""Settings: every bad value refused at start with its name; precedence
(argument > environment > queue_configuration > default) and where each
value came from; the generated reference in docs/configuration.md."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, MetaData, String, Table, Text, create_engine, insert
from sqlalchemy.orm import DeclarativeBase

from sqla_queue import ConfigurationError, WorkerBase
from sqla_queue.config.catalog import CATALOGUE
from sqla_queue.config.reference import render_reference, splice_reference
from sqla_queue.config.resolution import resolve
from sqla_queue.config.settings import Settings, normalize_url
from sqla_queue.schema.configuration_table import configuration_table
from sqla_queue.worker import Runner
from tests.acceptance.test_configuration import _cli_error
from tests.conftest import ROOT, run_cli
from tests.support import bad_workers
from tests.support.app import App

SECONDS_LEASE = "must be a number of seconds from 0.5 to 604800"


# ------------------------------------------------------------------ environment
@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "QUEUE_PURGE_MAX_AGE",
            "-1",
            "QUEUE_PURGE_MAX_AGE must be a number of days from 0 to 36500, not '-1'",
        ),
        (
            "QUEUE_PURGE_LIMIT",
            "nan",
            "QUEUE_PURGE_LIMIT must be a whole number from 1 to 100000, not 'nan'",
        ),
        ("SQLA_QUEUE_LEASE_SECONDS", "inf", f"SQLA_QUEUE_LEASE_SECONDS {SECONDS_LEASE}, not 'inf'"),
        ("SQLA_QUEUE_LEASE_SECONDS", "1e9", f"SQLA_QUEUE_LEASE_SECONDS {SECONDS_LEASE}, not '1e9'"),
        (
            "SQLA_QUEUE_ITEM_TTL",
            "-5",
            "SQLA_QUEUE_ITEM_TTL must be a number of minutes from 0 to 5256000, not '-5'",
        ),
        (
            "SQLA_QUEUE_TIME_LIMIT",
            "0",
            "SQLA_QUEUE_TIME_LIMIT must be a number of seconds greater than 0 and at most "
            "604800, or none, not '0'",
        ),
        (
            "SQLA_QUEUE_BACKOFF",
            "fibonacci",
            "SQLA_QUEUE_BACKOFF must be linear or exponential, not 'fibonacci'",
        ),
        (
            "SQLA_QUEUE_BACKOFF_FACTOR",
            "0.5",
            "SQLA_QUEUE_BACKOFF_FACTOR must be a number from 1 to 10, not '0.5'",
        ),
        (
            "QUEUE_MINUTE_PURGE_THREAD",
            "0,75",
            "QUEUE_MINUTE_PURGE_THREAD must list minutes from 0 to 59 (the seed's form), "
            "not '0,75'",
        ),
        (
            "SQLA_QUEUE_PURGE_CRON",
            "0 25 * * *",
            "SQLA_QUEUE_PURGE_CRON is not a valid cron string (Bad hour): '0 25 * * *'",
        ),
        (
            "SQLA_QUEUE_MAINTENANCE",
            "maybe",
            "SQLA_QUEUE_MAINTENANCE must be true or false, not 'maybe'",
        ),
    ],
)
def test_a_bad_variable_is_refused_with_its_name(variable: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({variable: value})
    assert str(info.value) == expected


def test_the_worker_command_refuses_a_bad_variable_in_one_line() -> None:
    assert _cli_error("Good", {"QUEUE_MINUTE_NOTIFY_THREAD": "*/5 * * *"}) == (
        "QUEUE_MINUTE_NOTIFY_THREAD is not a valid cron string (Wrong number of fields): "
        "'*/5 * * *'"
    )


# ------------------------------------------------------------------ class attributes
class LeaseText(bad_workers.Good):
    lease_seconds = "30"  # type: ignore[assignment]


class TimeLimitNegative(bad_workers.Good):
    time_limit_seconds = -1


class BackoffUnknown(bad_workers.Good):
    backoff_policy = "random"


class NoRetryNotATuple(bad_workers.Good):
    no_retry = ValueError  # type: ignore[assignment]


class MaintenanceText(bad_workers.Good):
    maintenance = "no"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        (
            LeaseText,
            "LeaseText.lease_seconds must be a number of seconds from 0.5 to 604800, not '30'",
        ),
        (
            TimeLimitNegative,
            "TimeLimitNegative.time_limit_seconds must be a number of seconds greater than 0 "
            "and at most 604800, or none, not -1",
        ),
        (
            BackoffUnknown,
            "BackoffUnknown.backoff_policy must be linear or exponential, not 'random'",
        ),
        (
            NoRetryNotATuple,
            "NoRetryNotATuple.no_retry must be a tuple of exception classes, "
            "not <class 'ValueError'>",
        ),
        (MaintenanceText, "MaintenanceText.maintenance must be True or False, not 'no'"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_a_bad_class_attribute_is_refused_with_its_name(
    worker: type[WorkerBase], expected: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        worker.check_configuration()
    assert str(info.value) == expected


def test_jitter_bounds_in_the_wrong_order_stop_the_worker(engine: Engine, app: App) -> None:
    class Jittery(app.RecordingWorker):  # type: ignore[name-defined,misc]
        backoff_policy = "exponential"
        backoff_jitter_min_seconds = 50

    env = Settings.from_env({"SQLA_QUEUE_BACKOFF_JITTER_MAX": "10"})
    with pytest.raises(ConfigurationError) as info:
        Runner.for_worker(Jittery(), engine=engine, settings=env)
    assert str(info.value) == (
        "backoff_jitter_min (50) must not exceed backoff_jitter_max (10) "
        "(from Jittery.backoff_jitter_min_seconds and SQLA_QUEUE_BACKOFF_JITTER_MAX)"
    )


# ------------------------------------------------------------------ the table
@pytest.fixture
def configuration(engine: Engine, app: App) -> Iterator[Any]:
    """The queue's configuration table (created, dropped after): the test
    app's models name their own, so no other test's worker reads it."""
    metadata = MetaData()
    table = configuration_table(metadata, app.Task.__queue_configuration__)
    metadata.create_all(engine)
    try:
        yield table
    finally:
        metadata.drop_all(engine)


def put(engine: Engine, table: Any, *rows: tuple[str, str, str | None]) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(table),
            [{"setting_name": name, "value": value, "unit": unit} for name, value, unit in rows],
        )


def test_precedence_argument_environment_table_default(
    engine: Engine, app: App, configuration: Any
) -> None:
    put(
        engine,
        configuration,
        ("lease_duration", "2", "minutes"),
        ("max_retries", "7", "count"),
        ("item_ttl", "3", "days"),
        ("backoff_base", "10", "seconds"),
        ("cron_schedule_retention_history", "*/7 * * * *", "cron"),
        ("audit_retention", "31", "days"),
    )

    class Tuned(app.RecordingWorker):  # type: ignore[name-defined,misc]
        lease_seconds = None
        backoff_factor = 3

    env = Settings.from_env({"QUEUE_MAX_RETRY": "4", "SQLA_QUEUE_BACKOFF_BASE": "20"})
    worker = Runner.for_worker(Tuned(), engine=engine, settings=env)
    effective = worker.effective
    got = {
        key: (effective[key], effective.source(key))
        for key in ("lease_seconds", "max_retry", "item_ttl", "backoff_base", "backoff_factor")
    }
    assert got == {
        "lease_seconds": (120, "queue_configuration[*].lease_duration"),
        "max_retry": (4, "QUEUE_MAX_RETRY"),
        "item_ttl": (4320, "queue_configuration[*].item_ttl"),
        "backoff_base": (20, "SQLA_QUEUE_BACKOFF_BASE"),
        "backoff_factor": (3, "Tuned.backoff_factor"),
    }
    assert effective["purge_schedule"].describe() == "*/7 * * * *"
    assert effective.unused == {"audit_retention": "no audit log in sqla-queue"}
    assert worker.app.lease.seconds == 120
    assert worker.app.settings.max_retry == 4


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            ("lease_duration", "30", "fortnights"),
            "queue_configuration.lease_duration has unit 'fortnights': use one of years, months, "
            "days, hours, minutes, seconds (or number, count, cron)",
        ),
        (
            ("lease_duration", "abc", "seconds"),
            "queue_configuration.lease_duration must be a number of seconds from 0.5 to 604800, "
            "not 'abc seconds'",
        ),
        (
            ("lease_duration", "9", "years"),
            "queue_configuration.lease_duration must be a number of seconds from 0.5 to 604800, "
            "not '9 years'",
        ),
        (
            ("max_retries", "NaN", "count"),
            "queue_configuration.max_retries must be a whole number from 1 to 1000000, not 'NaN'",
        ),
        (
            ("max_retries", "3", "days"),
            "queue_configuration.max_retries is not a duration; its unit cannot be 'days'",
        ),
        (
            ("cron_schedule_retention_queue", "*/7 * *", "cron"),
            "queue_configuration.cron_schedule_retention_queue is not a valid cron string "
            "(Wrong number of fields): '*/7 * *'",
        ),
        (
            ("lease_duartion", "30", "seconds"),
            "queue_configuration has an unknown setting 'lease_duartion' (known: ",
        ),
    ],
)
def test_a_bad_table_row_stops_the_worker_naming_the_row(
    engine: Engine, app: App, configuration: Any, row: tuple[str, str, str], expected: str
) -> None:
    put(engine, configuration, row)
    with pytest.raises(ConfigurationError) as info:
        Runner.for_worker(app.RecordingWorker(), engine=engine, settings=Settings())
    assert str(info.value).startswith(expected)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # resolution runs on all three
def test_config_show_prints_values_and_their_sources(
    engine: Engine, app: App, configuration: Any, db_url: str, table_name: str
) -> None:
    put(engine, configuration, ("lease_duration", "45", "seconds"))
    env = {"SQLA_QUEUE_TEST_TABLE": table_name, "QUEUE_PURGE_LIMIT": "250", "DB_PASS": "hunter2"}
    out = run_cli(
        "config", "show", "tests.support.app:FailingWorker", "--url", db_url, env=env
    ).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert out.splitlines()[0] == (
        "queue_configuration: 1 row(s) applied: 0 for this queue, 1 for every queue (*)"
    )
    assert lines["purge_limit"] == ["250", "QUEUE_PURGE_LIMIT"]
    assert lines["max_retry"] == ["3", "FailingWorker.max_retry"]
    assert lines["db_pass"] == ["***", "DB_PASS"]
    assert "hunter2" not in out
    # the URL the command was given, not "– default"
    assert lines["url"] == [db_url, "--url"]
    # durations with their units
    assert lines["item_ttl"] == ["0", "minutes", "default"]
    assert lines["retry_interval_minutes"] == [
        "0",
        "minutes",
        "FailingWorker.retry_interval_minutes",
    ]
    assert lines["purge_max_age"] == ["60", "days", "default"]
    assert lines["poll_interval"] == ["1", "seconds", "default"]
    assert lines["time_limit"] == ["none", "default"]
    # the test app's class sets lease_seconds, which wins over the table
    assert lines["lease_seconds"] == ["30", "seconds", "FailingWorker.lease_seconds"]


# ------------------------------------------------------------------ the reference
def test_the_settings_reference_in_the_docs_is_generated_from_the_catalogue() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert splice_reference(page) == page, (
        "docs/configuration.md is out of date: "
        "python -m sqla_queue.config.reference docs/configuration.md"
    )
    reference = render_reference()
    for entry in CATALOGUE:
        for variable in entry.env:
            assert f"`{variable}`" in reference


def test_the_catalogue_defaults_match_the_code() -> None:
    """The defaults the reference shows are the ones the code uses."""
    settings = Settings()
    effective = resolve(None, settings)
    for entry in CATALOGUE:
        if entry.settings_field is not None:
            assert getattr(settings, entry.settings_field) == entry.default, entry.key
        if entry.resolved and entry.default is not None and not isinstance(entry.default, str):
            assert effective[entry.key] == entry.default, entry.key
    assert not math.isnan(effective["backoff_base"])


#: what the package reads from the environment, in its source: env.get("X"),
#: env["X"], os.environ.get("X"), _flag(env, "X") and the like, and NAME = "X"
#: constants whose name ends in VARIABLE
_READS = re.compile(
    r'(?:env|environ)(?:\.get\(|\[)\s*"([A-Z][A-Z0-9_]+)"'
    r'|_\w+\(\s*env,\s*"([A-Z][A-Z0-9_]+)"'
    r'|^[A-Z_]*VARIABLE\s*=\s*"([A-Z][A-Z0-9_]+)"',
    re.MULTILINE,
)
#: the operating system's and Java's, not sqla-queue's settings
_NOT_SETTINGS = {"PATH", "JAVA_HOME", "PYSPARK_PYTHON", "SPARK_LOCAL_IP"}


def test_every_variable_the_package_reads_is_in_the_reference() -> None:
    read: dict[str, str] = {}
    for path in sorted((ROOT / "sqla_queue").rglob("*.py")):
        for match in _READS.finditer(path.read_text(encoding="utf-8")):
            name = next(group for group in match.groups() if group)
            read.setdefault(name, str(path.relative_to(ROOT)))
    assert {"SQLA_QUEUE_URL", "SQLA_QUEUE_SERVER_SECRET", "SQLA_QUEUE_SPARK_JARS"} <= set(read)
    documented = {variable for entry in CATALOGUE for variable in entry.env}
    missing = {name: where for name, where in read.items() if name not in documented}
    assert not {k: v for k, v in missing.items() if k not in _NOT_SETTINGS}, missing


def test_every_seed_variable_is_in_the_catalogue() -> None:
    seed = Path(ROOT).parent / "shared" / "seeds" / "nsj-queue-lib-README.pt-BR.md"
    names = {variable for entry in CATALOGUE for variable in entry.env}
    expected = {
        "DB_HOST", "DATABASE_HOST", "DB_PORT", "DATABASE_PORT", "DB_BASE", "DATABASE_NAME",
        "DB_USER", "DATABASE_USER", "DB_PASS", "DATABASE_PASS", "QUEUE_NAME", "QUEUE_TABLE",
        "QUEUE_SUBSCRIBER_TABLE", "LOG_DEBUG", "QUEUE_MAX_RETRY", "QUEUE_BASE_INTERVAL_RETRY",
        "QUEUE_MINUTE_RETRY_THREAD", "QUEUE_MINUTE_PURGE_THREAD", "QUEUE_MINUTE_NOTIFY_THREAD",
        "QUEUE_PURGE_MAX_AGE", "QUEUE_PURGE_LIMIT", "QUEUE_WAIT_NOTIFY_INTERVAL",
        "DEFAULT_WEBHOOK_TIMEOUT", "ENV", "GRAFANA_URL", "CLIENT_SERVER_MODE", "SERVER_HOST",
        "MAX_CLIENT_THREADS", "CHECK_TASKS_INTERVAL", "LOCK_SERVICE_WAIT_CONN_INTERVAL",
        "NOTIFY_SERVICE_PORT", "LOCK_SERVICE_PORT", "TIMEOUT_SOCKET_MESSAGE", "MULTI_DATABASE",
        "MULTI_DATABASE_USER", "MULTI_DATABASE_PASSWORD", "MULTI_DATABASE_CLIENT_ID",
        "MULTI_DATABASE_API_CREDETIALS_URL", "OAUTH_TOKEN_URL",
    }  # fmt: skip
    assert expected <= names, sorted(expected - names)
    if seed.exists():  # the seed's variables table, checked against the list above
        for name in expected:
            assert name in seed.read_text(encoding="utf-8"), name


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_a_configuration_table_made_for_one_queue_does_not_retune_another(
    kind: str, tmp_path: Path
) -> None:
    """``sqla-queue ddl --config-table`` for queue fila_a makes the schema's
    queue_configuration with PEQ's rows. They name fila_a: fila_b's worker,
    in the same schema, keeps its own settings, and takes a row only when it
    names fila_b or every queue (``*``). A table without queue_name (PEQ's,
    or an older one) is schema-wide, and the source says so."""
    from sqla_queue import QueueMixin, WorkerBase
    from sqla_queue.alembic.ddl import queue_ddl, queue_tables
    from sqla_queue.schema.configuration_table import CONFIGURATION_TABLE_NAME, configuration_rows
    from tests.support.migration_helpers import private_database

    assert "'fila_a'" in queue_ddl("main", "fila_a", dialect="sqlite", config_table=True)

    class Base(DeclarativeBase):
        pass

    class TaskA(QueueMixin, Base):
        __tablename__ = "fila_a"

    class TaskB(QueueMixin, Base):
        __tablename__ = "fila_b"

    class WorkerA(WorkerBase):
        model = TaskA

        def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

    class WorkerB(WorkerA):
        model = TaskB

    with private_database(kind, tmp_path) as url:
        engine = create_engine(normalize_url(url))
        try:
            Base.metadata.create_all(engine)
            metadata = MetaData()
            *_, config = queue_tables(None, "fila_a", config_table=True, metadata=metadata)
            config.create(engine)
            with engine.begin() as conn:
                conn.execute(insert(config), list(configuration_rows(config) or ()))
            a = Runner.for_worker(WorkerA(), engine=engine, settings=Settings()).effective
            b = Runner.for_worker(WorkerB(), engine=engine, settings=Settings()).effective
            assert (a["max_retry"], a.source("max_retry")) == (
                7,
                "queue_configuration[fila_a].max_retries",
            )
            assert (b["max_retry"], b.source("max_retry")) == (Settings().max_retry, "default")
            # a row for every queue reaches both; a row naming fila_b wins for it
            with engine.begin() as conn:
                conn.execute(
                    insert(config),
                    [
                        {
                            "setting_name": "item_ttl",
                            "queue_name": "*",
                            "value": "2",
                            "unit": "days",
                        },
                        {
                            "setting_name": "max_retries",
                            "queue_name": "fila_b",
                            "value": "9",
                            "unit": "count",
                        },
                    ],
                )
            b = Runner.for_worker(WorkerB(), engine=engine, settings=Settings()).effective
            assert (b["item_ttl"], b.source("item_ttl")) == (
                2880,
                "queue_configuration[*].item_ttl",
            )
            assert (b["max_retry"], b.source("max_retry")) == (
                9,
                "queue_configuration[fila_b].max_retries",
            )
            # an older table, without queue_name: every row for every queue
            config.drop(engine)
            legacy = Table(
                CONFIGURATION_TABLE_NAME,
                MetaData(),
                Column("setting_name", String(100), primary_key=True),
                Column("value", String(500)),
                Column("unit", String(20)),
                Column("casted_as", String(20)),
                Column("note", Text),
            )
            legacy.create(engine)
            with engine.begin() as conn:
                conn.execute(insert(legacy), [{"setting_name": "max_retries", "value": "7"}])
            b = Runner.for_worker(WorkerB(), engine=engine, settings=Settings()).effective
            assert (b["max_retry"], b.source("max_retry")) == (
                7,
                "queue_configuration.max_retries",
            )
        finally:
            Base.metadata.drop_all(engine)
            engine.dispose()
