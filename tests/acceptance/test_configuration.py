"""Configuration checked at start: one line naming the setting, no traceback.

The worker class (``WorkerBase.check_configuration``) and the environment
(``Settings.from_env``) are checked before a worker is instantiated or
connects, through the real ``sqla-queue worker`` command in a subprocess;
the variants of each mistake are checked in-process. No database is used.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sqla_queue import ConfigurationError, WorkerBase
from sqla_queue.config.resolution import resolve
from sqla_queue.config.settings import Settings
from tests.conftest import run_cli
from tests.support import bad_workers

RANGE_MAX_RETRY = "must be a whole number from 1 to 1000000"
RANGE_INTERVAL = "must be a number of minutes from 0 to 1440"
RANGE_BATCH_SIZE = "must be a whole number from 1 to 10000"
RANGE_BATCH_SECONDS = "must be a number of seconds greater than 0 and at most 86400"


def _cli_error(worker: str, env: dict[str, str] | None = None) -> str:
    """The command's whole stderr, which must be one ``Error:`` line."""
    proc = run_cli("worker", f"tests.support.bad_workers:{worker}", env=env, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: "), proc.stderr
    return lines[0].removeprefix("Error: ")


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        ("Abstract", "Abstract is abstract: implement execute(self, payload, task, session)"),
        (
            "AsyncGeneratorExecute",
            "AsyncGeneratorExecute.execute is an async generator; define it with async def "
            "and return, or with def",
        ),
        (
            "AsyncExecuteDead",
            "AsyncExecuteDead.execute_dead is a coroutine function and other handlers of "
            "AsyncExecuteDead are not: define every handler of a worker with async def, "
            "or every one with def",
        ),
        ("MaxRetryBool", f"MaxRetryBool.max_retry {RANGE_MAX_RETRY}, not True"),
        ("IntervalNaN", f"IntervalNaN.retry_interval_minutes {RANGE_INTERVAL}, not nan"),
        ("BatchSizeHuge", f"BatchSizeHuge.batch_size {RANGE_BATCH_SIZE}, not 10001"),
        ("BatchSecondsZero", f"BatchSecondsZero.batch_seconds {RANGE_BATCH_SECONDS}, not 0"),
        (
            "UnmappedModel",
            "UnmappedModel.model must be a mapped QueueMixin model, not <class 'dict'>",
        ),
        (
            "TenantHandlerWithoutMultiDatabase",
            "TenantHandlerWithoutMultiDatabase.execute takes tenant_session, but "
            "multi-database mode is off: set MULTI_DATABASE=true (or the class's "
            "multi_database = True or tenant_resolver), or drop tenant_session",
        ),
        (
            "ExecuteWithoutSession",
            "ExecuteWithoutSession.execute must take (self, payload, task, session)",
        ),
    ],
)
def test_worker_command_refuses_a_bad_class_in_one_line(worker: str, expected: str) -> None:
    assert _cli_error(worker) == expected


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("QUEUE_MAX_RETRY", "nan", f"QUEUE_MAX_RETRY {RANGE_MAX_RETRY}, not 'nan'"),
        (
            "QUEUE_BASE_INTERVAL_RETRY",
            "inf",
            f"QUEUE_BASE_INTERVAL_RETRY {RANGE_INTERVAL}, not 'inf'",
        ),
        (
            "SQLA_QUEUE_POLL_INTERVAL",
            "1e308",
            "SQLA_QUEUE_POLL_INTERVAL must be a number of seconds greater than 0 and at "
            "most 86400, not '1e308'",
        ),
    ],
)
def test_worker_command_names_the_environment_variable(
    variable: str, value: str, expected: str
) -> None:
    assert _cli_error("Good", {variable: value}) == expected


# ------------------------------------------------------------- in-process
@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        (bad_workers.MaxRetryZero, f"MaxRetryZero.max_retry {RANGE_MAX_RETRY}, not 0"),
        (bad_workers.MaxRetryText, f"MaxRetryText.max_retry {RANGE_MAX_RETRY}, not '3'"),
        (bad_workers.MaxRetryFloat, f"MaxRetryFloat.max_retry {RANGE_MAX_RETRY}, not 2.0"),
        (
            bad_workers.IntervalNegative,
            f"IntervalNegative.retry_interval_minutes {RANGE_INTERVAL}, not -1",
        ),
        (
            bad_workers.IntervalInfinite,
            f"IntervalInfinite.retry_interval_minutes {RANGE_INTERVAL}, not inf",
        ),
        (bad_workers.BatchSizeFloat, f"BatchSizeFloat.batch_size {RANGE_BATCH_SIZE}, not 2.5"),
        (
            bad_workers.BatchSecondsInfinite,
            f"BatchSecondsInfinite.batch_seconds {RANGE_BATCH_SECONDS}, not inf",
        ),
        (bad_workers.NoModel, "NoModel.model must be a mapped QueueMixin model, not None"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_check_configuration_names_the_class_and_attribute(
    worker: type[WorkerBase], expected: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        worker.check_configuration()
    assert str(info.value) == expected


def test_a_good_worker_passes_the_check() -> None:
    bad_workers.Good.check_configuration()


def test_an_abstract_method_of_a_subclass_is_named() -> None:
    import abc

    class Pipeline(bad_workers.Good):
        @abc.abstractmethod
        def stage(self) -> None: ...

    with pytest.raises(ConfigurationError, match="Pipeline is abstract: implement stage"):
        Pipeline.check_configuration()


def test_run_checks_the_class_before_connecting() -> None:
    # run() must refuse before it creates an engine: this URL's driver is absent
    with pytest.raises(ConfigurationError, match=r"AsyncExecuteDead\.execute_dead is a coroutine"):
        bad_workers.AsyncExecuteDead().run("postgresql+pg8000://u@127.0.0.1:1/db")


class TestBackoffNamesTheSource:
    """The retry rule's values come from the class or from the environment
    (``resolve``); an invalid one is reported under the name it came from."""

    def test_class_attribute_is_named(self) -> None:
        class Good(bad_workers.Good):
            max_retry = 0

        with pytest.raises(ConfigurationError, match=r"^Good\.max_retry must be"):
            resolve(Good, Settings())

    def test_environment_variable_is_named(self) -> None:
        with pytest.raises(ConfigurationError, match=r"^QUEUE_MAX_RETRY must be"):
            Settings.from_env({"QUEUE_MAX_RETRY": "0"})

    def test_interval_from_the_class_is_named(self) -> None:
        class Good(bad_workers.Good):
            retry_interval_minutes = math.nan

        with pytest.raises(ConfigurationError, match=r"^Good\.retry_interval_minutes must be"):
            resolve(Good, Settings())

    def test_interval_from_the_environment_is_named(self) -> None:
        with pytest.raises(ConfigurationError, match=r"^QUEUE_BASE_INTERVAL_RETRY must be"):
            Settings.from_env({"QUEUE_BASE_INTERVAL_RETRY": "inf"})

    def test_class_values_win_over_the_environment(self) -> None:
        class Tuned(bad_workers.Good):
            max_retry = 4
            retry_interval_minutes = 0.5

        settings = Settings.from_env({"QUEUE_MAX_RETRY": "9", "QUEUE_BASE_INTERVAL_RETRY": "2"})
        effective = resolve(Tuned, settings)
        assert (effective["max_retry"], effective["retry_interval_minutes"]) == (4, 0.5)


def test_an_engine_whose_pool_cannot_hold_the_lanes_is_refused(tmp_path: Path) -> None:
    """SQLite's default pool once let --concurrency 8 hang for 30 s and fail
    with QueuePool limit reached; an engine passed in is now checked at start."""
    from sqlalchemy import create_engine

    from tests.support.app import RecordingWorker

    engine = create_engine(f"sqlite:///{tmp_path}/queue.db", pool_size=5, max_overflow=10)
    try:
        with pytest.raises(ConfigurationError) as error:
            RecordingWorker().run(engine=engine, concurrency=7, settings=Settings())
        assert str(error.value) == (
            "the engine's pool allows 15 connections and 7 lane(s) need 21: "
            "lower --concurrency or raise pool_size/max_overflow"
        )
    finally:
        engine.dispose()
