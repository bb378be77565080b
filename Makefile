# Two commands set everything up on a fresh machine:
#   make quickstart   the quick start on SQLite (embedded, nothing to run)
#   make test         the whole test suite (installs PgBouncer if missing,
#                     starts PostgreSQL/MariaDB if down)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: quickstart test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check --upgrade pip
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

quickstart: $(VENV)/.installed
	$(PY) examples/quickstart.py

test: $(VENV)/.installed
	scripts/install-test-deps.sh
	scripts/start-databases.sh
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check sqla_queue tests examples benchmarks
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	benchmarks/run.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache quickstart.db*
