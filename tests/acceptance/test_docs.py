"""The documentation's code, as a new user copies it.

Every ``from sqla_queue... import ...`` line that README.md and docs/*.md
show must import: a page that names a class the package does not export
sends its reader to an ImportError.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_IMPORT = re.compile(r"^\s*(from sqla_queue[\w.]* import [\w, ]+|import sqla_queue[\w.]*)\s*$")


def _imports() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(ROOT)}:{number}", match.group(1).strip())
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if (match := _IMPORT.match(line))
    ]


@pytest.mark.parametrize(("where", "statement"), _imports(), ids=lambda value: str(value))
def test_every_import_the_docs_show_works(where: str, statement: str) -> None:
    exec(statement, {})


def test_the_settings_of_worker_run_import_from_the_package() -> None:
    """docs/client-server.md: Worker().run(settings=Settings.from_env())."""
    import sqla_queue.config.settings
    from sqla_queue import Settings

    assert Settings is sqla_queue.config.settings.Settings


def _code_block(page: str, heading: str) -> str:
    """The first ```python block after ``heading`` in docs/``page``."""
    text = (ROOT / "docs" / page).read_text()
    section = text.split(heading, 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"docs/{page} lost its example under {heading!r}"
    return found.group(1)


def test_the_tenants_example_runs_as_written_on_a_server_of_its_own(
    private_postgres: Any, tmp_path: Path
) -> None:
    """docs/tenants.md's example, on a PostgreSQL server on another port than
    5432 with none of its databases: it makes them and bills both tenants."""
    script = tmp_path / "tenants_example.py"
    script.write_text(_code_block("tenants.md", "## A runnable example"))
    server = f"postgresql+psycopg://postgres@127.0.0.1:{private_postgres.port}"
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "SERVER_URL": server},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for tenant, customer in ((47, "ACME"), (48, "Globex")):
        engine = create_engine(f"{server}/erp_{tenant}")
        with engine.connect() as conn:
            customers = conn.execute(text("SELECT customer FROM invoice")).scalars().all()
        engine.dispose()
        assert customers == [customer]


def test_the_pubsub_example_runs_with_a_url_that_names_no_driver(tmp_path: Path) -> None:
    """docs/pubsub.md: SQLA_QUEUE_URL=mysql://... python examples/pubsub.py."""
    from tests.support.migration_helpers import private_database

    with private_database("mysql", tmp_path) as url:
        plain = make_url(url).set(drivername="mysql").render_as_string(hide_password=False)
        done = subprocess.run(
            [sys.executable, "examples/pubsub.py"],
            cwd=ROOT,
            env={**os.environ, "SQLA_QUEUE_URL": plain},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "indexed order 42" in done.stdout


@pytest.mark.parametrize(
    ("heading", "printed"),
    [
        ("## SQLModel (and FastAPI)", "1 [('sucesso', 'billed 42')]"),
        ("## Flask-SQLAlchemy", "1 ['sucesso']"),
    ],
)
def test_the_frameworks_examples_run_as_written(heading: str, printed: str, tmp_path: Path) -> None:
    """docs/frameworks.md: a SQLModel model and a Flask-SQLAlchemy model with
    QueueMixin, enqueued in the framework's session and run by the worker."""
    script = tmp_path / "app.py"
    script.write_text(_code_block("frameworks.md", heading))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == printed
    assert "Warning" not in done.stderr, done.stderr


def _python_blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(ROOT)}#{number}", found.group(1))
        for page in PAGES
        for number, found in enumerate(
            re.finditer(r"```python\n(.*?)```", page.read_text(), re.DOTALL), 1
        )
    ]


@pytest.mark.parametrize(("where", "code"), _python_blocks(), ids=lambda value: str(value)[:40])
def test_every_python_example_in_the_docs_is_valid_python(where: str, code: str) -> None:
    """A page's example that does not even parse fails its reader at once;
    the examples the other tests here run go further."""
    compile(code, where, "exec")


def _file_links() -> list[tuple[str, str]]:
    """(where, path in the repository) of each link to a file of ours: the
    docs' relative links, the README's github.com/.../blob/main/ ones."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)#\s]+)", line):
                if target.startswith("https://github.com/sqla-queue/sqla-queue/blob/main/"):
                    path = target.split("/blob/main/", 1)[1]
                elif "://" in target or target.startswith("mailto:"):
                    continue
                else:
                    path = str((page.parent / target).resolve().relative_to(ROOT))
                found.append((f"{page.relative_to(ROOT)}:{number}", path))
    return found


def test_every_link_to_a_file_of_ours_finds_it() -> None:
    """The docs link to modules and examples by path: a move (the layer
    folders) must not leave a link to nowhere."""
    missing = [f"{where}: {path}" for where, path in _file_links() if not (ROOT / path).exists()]
    assert missing == []
