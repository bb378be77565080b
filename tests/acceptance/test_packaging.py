"""Packaging: the drivers are extras, and what happens when one is missing.

A test that builds a fresh virtual environment without drivers would take
minutes, so the missing drivers here are real in two other ways: drivers that
are not installed in the test environment (pg8000, MySQLdb: SQLAlchemy knows
them, sqla-queue's extras do not install them), and, in a subprocess, the
extras' own drivers made unimportable by an import hook that answers for
them exactly as Python does for a module that is not installed.

Also the end-of-run report of the databases that were not tested.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.orm import Session

from sqla_queue import ConfigurationError
from sqla_queue.config.settings import driver_error, normalize_url
from tests.conftest import ROOT, run_cli
from tests.support.app import App

# Runs the real CLI after installing an import hook that refuses the
# distributions named in argv[1] (comma-separated) as if they were absent.
WITHOUT = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

ABSENT = set(sys.argv[1].split(","))
sys.meta_path.insert(0, NotInstalled())
sys.argv = ["sqla-queue", *sys.argv[2:]]
from sqla_queue.cli import main
main()
"""
DRIVER_MODULES = "psycopg,psycopg_binary,pymysql,singlestoredb,sqlalchemy_singlestoredb"


def run_cli_without(
    absent: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, absent, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _engine_error(url: str) -> BaseException:
    """What create_engine raises for ``url`` (whose driver is not installed)."""
    try:
        create_engine(normalize_url(url))
    except Exception as exc:
        return exc
    raise AssertionError(f"create_engine({url!r}) did not fail")


def _absent(module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here; this test needs it absent")


# ------------------------------------------------------------- the extras
def test_base_requirements_have_no_database_driver() -> None:
    """SQLite needs no driver: every driver is behind an extra."""
    by_extra: dict[str, set[str]] = {}
    for line in importlib.metadata.requires("sqla-queue") or []:
        requirement = Requirement(line)
        extra = ""
        if requirement.marker is not None:
            # "extra == 'mysql'": the one marker sqla-queue's requirements use
            extra = str(requirement.marker).split("==")[1].strip().strip("\"'")
        by_extra.setdefault(extra, set()).add(requirement.name.lower())
    # cronsim: the maintenance schedules' cron strings (pure Python, no dependencies)
    # rich: sqla-queue status's tables (pure Python)
    assert by_extra[""] == {"sqlalchemy", "alembic", "requests", "click", "cronsim", "rich"}
    # each database's extra: its sync driver, its async driver, greenlet
    assert by_extra["postgresql"] == {"psycopg", "greenlet"}
    assert by_extra["mysql"] == {"pymysql", "asyncmy", "greenlet"}
    assert by_extra["sqlite"] == {"aiosqlite", "greenlet"}
    assert by_extra["singlestore"] == {"singlestoredb", "sqlalchemy-singlestoredb"}
    # the test extra: the postgresql and mysql extras, and the SingleStore
    # dialect for the DDL tests, but not the singlestore extra
    assert {"sqla-queue", "sqlalchemy-singlestoredb"} <= by_extra["test"]
    assert "singlestoredb" not in by_extra["test"]


def test_singlestoredb_pytest_plugin_is_not_loaded(pytestconfig: pytest.Config) -> None:
    """singlestoredb registers a pytest11 plugin; addopts turns it off."""
    assert not pytestconfig.pluginmanager.has_plugin("singlestoredb")
    assert pytestconfig.pluginmanager.is_blocked("singlestoredb")


# ----------------------------------------------------- a driver is missing
@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("postgresql+pg8000://app:s3cr3t@db/erp", "pg8000", "postgresql"),
        ("mysql+mysqldb://app@db/erp", "MySQLdb", "mysql"),
    ],
)
def test_a_driver_no_extra_installs_is_named_with_the_extra(
    url: str, module: str, extra: str
) -> None:
    _absent(module)
    error = driver_error(make_url(url), _engine_error(url))
    assert isinstance(error, ConfigurationError)
    message = str(error)
    assert f"driver module {module} (for {make_url(url).drivername}://) is not installed" in (
        message
    )
    assert f"pip install 'sqla-queue[{extra}]'" in message
    assert "s3cr3t" not in message
    assert "\n" not in message


def test_an_unknown_dialect_is_not_called_a_missing_driver() -> None:
    url = "postgresql+nosuchdriver://db/erp"
    exc = _engine_error(url)
    assert isinstance(exc, NoSuchModuleError)
    assert driver_error(make_url(url), exc) is None


def test_a_missing_singlestore_dialect_names_the_extra() -> None:
    # what create_engine raises when sqlalchemy-singlestoredb is not installed
    exc = NoSuchModuleError("Can't load plugin: sqlalchemy.dialects:singlestoredb")
    assert str(driver_error(make_url("singlestoredb://db/x"), exc)) == (
        "the SingleStore driver singlestoredb is not installed: "
        "pip install 'sqla-queue[singlestore]'"
    )


def test_worker_command_names_the_extra_for_a_driver_not_installed() -> None:
    _absent("pg8000")
    proc = run_cli(
        "worker",
        "tests.support.bad_workers:Good",
        "--url",
        "postgresql+pg8000://u@db/erp",
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "Error: the PostgreSQL driver module pg8000 (for postgresql+pg8000://) is not "
        "installed: install it, or use postgresql:// with pip install 'sqla-queue[postgresql]'"
    ]


@pytest.mark.parametrize(
    ("url", "absent", "expected"),
    [
        (
            "postgresql://u@127.0.0.1:1/db",
            "psycopg",
            "the PostgreSQL driver psycopg is not installed: pip install 'sqla-queue[postgresql]'",
        ),
        (
            "mysql://u@127.0.0.1:1/db",
            "pymysql",
            "the MySQL driver PyMySQL is not installed: pip install 'sqla-queue[mysql]'",
        ),
        (
            "singlestoredb://u@127.0.0.1:1/db",
            "singlestoredb",
            "the SingleStore driver singlestoredb is not installed: "
            "pip install 'sqla-queue[singlestore]'",
        ),
    ],
    ids=["postgresql", "mysql", "singlestore"],
)
def test_worker_command_without_the_extras_driver(url: str, absent: str, expected: str) -> None:
    proc = run_cli_without(absent, "worker", "tests.support.bad_workers:Good", "--url", url)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"Error: {expected}"]


def test_sqlite_worker_runs_without_any_driver(
    tmp_path: Path, app: App, table_name: str, installed: None
) -> None:
    """The base install: a SQLite worker imports no driver at all."""
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    engine = create_engine(url)
    app.Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(app.Task(process="p", payload={"n": 1}))
    proc = run_cli_without(
        DRIVER_MODULES,
        "worker",
        "tests.support.app:RecordingWorker",
        "--url",
        url,
        "--burst",
        env={"SQLA_QUEUE_TEST_TABLE": table_name},
    )
    assert proc.returncode == 0, proc.stderr
    with Session(engine) as session:
        assert session.scalars(select(app.Task.status)).all() == ["sucesso"]
    engine.dispose()


# ------------------------------------------- databases the run did not test
def test_a_run_without_servers_says_so_at_the_end() -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SQLA_QUEUE_REQUIRE_DATABASES", "PYTEST_ADDOPTS")
    }
    env.update(
        SQLA_QUEUE_TEST_POSTGRES_URL="postgresql+psycopg://postgres:pw@127.0.0.1:1/test",
        SQLA_QUEUE_TEST_MYSQL_URL="mysql+pymysql://root@127.0.0.1:1/test",
        DOCKER_HOST="unix:///nonexistent/docker.sock",  # no testcontainers fallback
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/integration/test_enqueue.py",
            "-k",
            "postgresql or mysql",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if "DATABASES NOT TESTED" in line)
    report = "\n".join(lines[header:])
    # the report is the last thing before pytest's final counts
    assert "short test summary info" not in report
    assert len(lines) - header == 7, report
    assert "passed" in lines[-1] or "skipped" in lines[-1]
    assert "postgresql: " in report
    assert "no server at postgresql+psycopg://postgres:***@127.0.0.1:1/test" in report
    assert "SQLA_QUEUE_TEST_POSTGRES_URL=" in report
    assert "mysql: " in report
    assert "SQLA_QUEUE_TEST_MYSQL_URL=" in report
    assert "pw@" not in report


# -------------------------------------------------------------- the README
REPOSITORY = "https://github.com/sqla-queue/sqla-queue/blob/main/"


def test_readme_links_work_on_the_package_index() -> None:
    """PyPI shows the README without the repository: relative links break."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets
    for target in targets:
        assert target.startswith("https://"), target
        if target.startswith(REPOSITORY):
            # and the file it points at exists (in this checkout)
            assert (ROOT / target.removeprefix(REPOSITORY).split("#")[0]).exists(), target


# ------------------------------------------------------ the built wheel
TEMPLATE_FILES = ("README", "alembic.ini.mako", "env.py", "script.py.mako")


def test_the_wheel_ships_the_alembic_templates_and_the_packages(tmp_path: Path) -> None:
    """A real build (``python -m build``, PEP 517: the sdist, then the
    wheel from the unpacked sdist, as make check-package builds them): the
    wheel's sqla_queue/ is the checkout's, file for file, the alembic
    templates with their README and .mako files among them; and setuptools
    warns of nothing (it warned, in about 80 lines of make quickstart, that
    each template folder was absent from the packages configuration).

    Not ``pip wheel .``: a build in the checkout copies whatever an earlier
    one left in its build/lib into the wheel (this checkout's held 57
    modules of the layout before the layer folders), and leaves build/lib
    behind for the next."""
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "Warning" in line]
    assert warnings == [], "\n".join(warnings)
    (wheel,) = tmp_path.glob("sqla_queue-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for template in ("generic", "multidb"):
        for name in TEMPLATE_FILES:
            assert f"sqla_queue/alembic_templates/{template}/{name}" in names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    source = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "sqla_queue").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert {name for name in names if name.startswith("sqla_queue/")} == source
    assert "sqla_queue/py.typed" in names
    assert not any(name.startswith(("tests/", "benchmarks/", "examples/")) for name in names)


def test_an_editable_install_prints_no_setuptools_notice(tmp_path: Path) -> None:
    """``pip install -e .`` (what make quickstart runs) into a fresh
    environment: a ``.pth`` file pointing at the checkout, and not a word
    from setuptools (a package mapped from another folder made it install a
    meta path finder and print a ten-line notice about it)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    proc = subprocess.run(
        [*pip, "install", "-q", "--no-deps", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # this machine's pip configuration names index folders that may be absent
    said = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and "is ignored: it is neither a file nor a directory" not in line
    ]
    assert said == [], "\n".join(said)
    (pth,) = venv.glob("lib/python*/site-packages/__editable__.sqla_queue*.pth")
    assert pth.read_text().split() == [str(ROOT.resolve())]
