# Two commands set everything up on a fresh machine:
#   make quickstart   the quick start on SQLite (embedded, nothing to run); installs
#                     sqla-queue alone: no database driver, no test or lint tools
#   make test         the whole test suite (installs PgBouncer if missing, starts
#                     PostgreSQL/MariaDB if down); installs .[dev]: the PostgreSQL
#                     and MySQL drivers, pytest, ruff, mypy
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip install -q --disable-pip-version-check
# pytest-xdist workers for make test (each with databases of its own:
# tests/conftest.py); TEST_WORKERS=0 runs the suite in one process. Four on
# two cores: most of a test's time is waiting on a server, a subprocess or a
# JVM (2 workers: 844-917 s quiet; 4: 416 s, docs/configuration.md)
TEST_WORKERS ?= 4

.PHONY: quickstart test test-sqlalchemy-2.0 check-package fuzz lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

# sqla-queue alone (SQLAlchemy, alembic, click, requests): all SQLite needs
$(VENV)/.installed-base: pyproject.toml | $(PY)
	$(PIP) -e .
	touch $@

# sqla-queue with the test extras (drivers) and the dev tools
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) -e '.[dev]'
	touch $@

quickstart: $(VENV)/.installed-base
	$(PY) examples/quickstart.py

test: $(VENV)/.installed-dev
	scripts/install-test-deps.sh
	scripts/start-databases.sh
	@# bytecode written now, once: the suite starts a few hundred Python
	@# subprocesses (workers, the CLI), and where PYTHONDONTWRITEBYTECODE is
	@# set (it is on these machines) each compiled sqla-queue again (0.2 s)
	$(PY) -m compileall -q sqla_queue tests
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# pyproject.toml allows SQLAlchemy >=2.0.30,<2.2 and make test runs the
# venv's 2.1: this runs the adapter suites (not the plans on large tables,
# the DDL through the database clients, SingleStore's server mode: slow, and
# little of SQLAlchemy in them) and the core integration tests
# (claims, the worker, enqueue, the flush hook, async; SQLAlchemy's private
# API, tests/unit/test_sqlalchemy_private.py) on the newest 2.0.x, in a venv
# of its own (under .cache/, which clean removes)
VENV_SQLALCHEMY_20 ?= .cache/venv-sqlalchemy-2.0
PY_SQLALCHEMY_20 := $(VENV_SQLALCHEMY_20)/bin/python
PIP_SQLALCHEMY_20 := $(VENV_SQLALCHEMY_20)/bin/pip install -q --disable-pip-version-check
SQLALCHEMY_20 := 'SQLAlchemy>=2.0.30,<2.1'
SQLALCHEMY_20_TESTS ?= tests/unit/test_sqlalchemy_private.py tests/adapters \
	--ignore=tests/adapters/test_plans.py --ignore=tests/adapters/test_ddl.py \
	--ignore=tests/adapters/test_singlestore.py tests/integration/test_worker.py \
	tests/integration/test_client.py tests/integration/test_claims.py \
	tests/integration/test_enqueue.py tests/integration/test_flush_insert.py \
	tests/integration/test_async_worker.py tests/integration/test_async_enqueue.py

$(PY_SQLALCHEMY_20):
	$(PYTHON) -m venv $(VENV_SQLALCHEMY_20)
	$(PIP_SQLALCHEMY_20) --upgrade pip

$(VENV_SQLALCHEMY_20)/.installed: pyproject.toml | $(PY_SQLALCHEMY_20)
	$(PIP_SQLALCHEMY_20) -e '.[test]' $(SQLALCHEMY_20)
	touch $@

test-sqlalchemy-2.0: $(VENV_SQLALCHEMY_20)/.installed
	@# --upgrade: the newest 2.0.x on every run, not the one of the venv's first
	$(PIP_SQLALCHEMY_20) --upgrade $(SQLALCHEMY_20)
	scripts/install-test-deps.sh
	scripts/start-databases.sh
	$(PY_SQLALCHEMY_20) -c 'import sqlalchemy; print("SQLAlchemy", sqlalchemy.__version__)'
	$(PY_SQLALCHEMY_20) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(SQLALCHEMY_20_TESTS) $(PYTEST_ARGS)

# the sdist and the wheel as a user gets them: built (python -m build),
# twine check, the wheel with its extras in a fresh venv running the quick
# start outside the checkout (scripts/check-package.sh says what else)
check-package: $(VENV)/.installed-dev
	scripts/check-package.sh

# the fuzz and flood tests with many more generated inputs than make test runs
fuzz: $(VENV)/.installed-dev
	scripts/start-databases.sh
	SQLA_QUEUE_FUZZ_EXAMPLES=$${SQLA_QUEUE_FUZZ_EXAMPLES:-5000} $(PY) -m pytest -m fuzz $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check sqla_queue tests examples benchmarks scripts setup.py
	$(VENV)/bin/mypy

bench: $(VENV)/.installed-dev
	benchmarks/run.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache quickstart.db*
