"""The package's shape, read from its source: no import circle, and no
layer (a folder of ``sqla_queue/``, in the order of LAYERS) imports from a
layer above it.

Every import counts: at module level, inside functions (lazy), and under
``TYPE_CHECKING``. ``from package import name`` counts as importing the
submodule ``package.name`` when there is one, else ``package`` itself; a
submodule's implicit import of its parent package does not count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "sqla_queue"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "alembic_templates" in path.parts:  # alembic's files, run by alembic
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``node``, in ``module``, imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            here = module.split(".")
            if modules[module].name != "__init__.py":
                here.pop()  # a module's relative imports start at its package
            base = here[: len(here) - node.level + 1]
            prefix = ".".join([*base, *([node.module] if node.module else [])])
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{alias.name}" for alias in node.names]
        if not all(name in modules for name in names):
            names.append(prefix)  # a name defined in the module, not a submodule
        names = [name for name in names if name in modules or name == prefix]
    found = set()
    for name in names:
        while name and name not in modules:  # sqla_queue.x.Name -> sqla_queue.x
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(module, node, modules)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The reader itself: a function-level import and a TYPE_CHECKING one
    are edges (the manager's type-only import of the webhook worker was one
    of the circles this test was written against)."""
    graph = import_graph()
    assert "sqla_queue.worker.runner" in graph["sqla_queue.worker.base"]  # inside run()
    assert (
        "sqla_queue.config.settings" in graph["sqla_queue.config.resolution"]
    )  # TYPE_CHECKING only
    assert "sqla_queue.worker.providers" in graph["sqla_queue.worker.app"]  # from . import
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert circles(import_graph()) == []


# ------------------------------------------------------------------ layers
#: the layers of ``sqla_queue/``, bottom to top: one folder each (the names
#: docs/architecture.md draws); a module imports from its own layer and those
#: below, never above. The facade on top: the package's ``__init__``, the
#: old paths (``_moved``) and the users' test helpers (``testing``).
LAYERS = (
    ("common", "errors, identifiers, column types, payloads, redaction, logging"),
    ("config", "the settings' catalogue, the environment, resolution, ranges"),
    ("schema", "the table contract: mixins, records, rows, the tables beside"),
    ("adapters", "every statement, per dialect; locks; SQLAlchemy's private API"),
    ("webhooks", "the HTTP side of webhooks: delivery, URL guard, transport"),
    ("enqueue", "the session's flush hook, unique keys, routing"),
    ("policies", "retries, leases, time limits, limits, fairness, pipeline, hooks"),
    ("batch", "one lane's batch: the manager and its transaction"),
    ("stages", "work a batch needs besides its handlers: fan-out, webhooks"),
    ("client", "the application's side: enqueue, requeue, control, pause"),
    ("maintenance", "the routines and their schedules"),
    ("worker", "the worker classes, QueueApp (assembly), the runner"),
    ("server", "the queue server (client-server mode)"),
    ("ops", "status, counts, metrics, tracing, the dashboard"),
    ("alembic", "migrations and DDL"),
    ("spark", "the Spark pipeline"),
    ("cli", "the commands"),
    ("", "the facade: __init__, _moved, testing"),
)
FACADE = {"sqla_queue", "sqla_queue._moved", "sqla_queue.testing"}


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module``'s layer (its folder)."""
    if module in FACADE:
        return len(LAYERS) - 1
    names = [name for name, _ in LAYERS]
    return names.index(module.split(".")[1])


def upward_imports(graph: dict[str, set[str]]) -> Iterator[tuple[str, str]]:
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            if layer_of(other) > layer_of(module):
                yield module, other


def test_every_module_is_in_a_layer() -> None:
    unknown = []
    for module in import_graph():
        try:
            layer_of(module)
        except ValueError:
            unknown.append(module)
    assert unknown == [], "a folder or top-level module that LAYERS does not list"


def test_no_layer_imports_from_a_layer_above() -> None:
    assert list(upward_imports(import_graph())) == []


def test_the_layer_reader_finds_an_upward_import() -> None:
    graph = {"sqla_queue.common.types": {"sqla_queue.worker.app"}, "sqla_queue.cli.x": set()}
    assert list(upward_imports(graph)) == [("sqla_queue.common.types", "sqla_queue.worker.app")]


# ------------------------------------------------------------- dialect code
#: where SQL text and tests of the dialect belong, and why
DIALECT_PLACES = {
    "sqla_queue/adapters/": "every statement on the queue, per dialect",
    "sqla_queue/alembic/ddl.py": "the CREATE statements",
    "sqla_queue/common/ddl_singlestore.py": "SingleStore's CREATE TABLE options",
    "sqla_queue/common/dialects.py": "the dialects sqla-queue ddl compiles for",
    "sqla_queue/alembic/": "the migration operations",
    "sqla_queue/schema/mixins.py": "the schema",
    "sqla_queue/common/types.py": "the schema's column types",
    "sqla_queue/config/settings.py": "URLs and drivers, before any adapter exists",
    "sqla_queue/spark/jdbc.py": "Spark's JDBC URLs and drivers",
}
DIALECTS = {"postgresql", "postgres", "mysql", "mariadb", "sqlite", "singlestore", "singlestoredb"}
SQL_WORDS = ("SELECT", "UPDATE", "INSERT", "DELETE", "KILL", "SET ", "LOCK", "VACUUM", "ANALYZE")
SQL_WORDS += ("BEGIN", "PRAGMA", "CREATE", "DROP", "ALTER")


def _strings(node: ast.expr) -> list[object]:
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


def dialect_code(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) of each comparison with a dialect's name and each SQL
    text (``text("SELECT ...")``, ``exec_driver_sql``) in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            values = [v for side in (node.left, *node.comparators) for v in _strings(side)]
            if any(isinstance(v, str) and v in DIALECTS for v in values):
                yield node.lineno, "a test of the dialect"
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            first = node.args[0]
            sql = isinstance(first, ast.Constant) and str(first.value).lstrip().upper()
            if name in ("text", "exec_driver_sql") and sql and sql.startswith(SQL_WORDS):
                yield node.lineno, "SQL text"


def test_the_reader_finds_dialect_tests_and_sql_text() -> None:
    source = (
        "if conn.dialect.name == 'postgresql': pass\n"
        "ok = family in ('mysql', 'mariadb')\n"
        "conn.execute(text('SELECT pg_sleep(1)'))\n"
        "conn.exec_driver_sql('PRAGMA busy_timeout = 1')\n"
        "label = text('a message')\n"
    )
    assert sorted(line for line, _ in dialect_code(source)) == [1, 2, 3, 4]


def test_sql_text_and_dialect_tests_stay_in_their_places() -> None:
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "alembic_templates" not in path.parts
        and not path.relative_to(ROOT).as_posix().startswith(tuple(DIALECT_PLACES))
        for line, what in dialect_code(path.read_text(encoding="utf-8"))
    ]
    assert found == []


# ----------------------------------------------------------- a worker's imports
#: what a worker on PostgreSQL or MariaDB imports only where it is used: the
#: webhook client (requests and its cookie jar, about 7 MiB) and sqlite3
#: (1 MiB); an idle worker's RSS is mostly imports (docs/benchmarks.md (e))
LAZY_MODULES = ("requests", "http.cookiejar", "sqlite3")


def test_a_worker_on_a_server_database_does_not_import_what_it_does_not_use() -> None:
    program = (
        "import sys\n"
        "import sqla_queue, sqla_queue.cli, sqla_queue.worker.runner\n"
        "import sqla_queue.adapters.postgresql, sqla_queue.adapters.mysql\n"
        f"print(' '.join(m for m in {LAZY_MODULES!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == []


# ------------------------------------------------------- one place assembles
def test_the_runner_takes_a_built_app_and_builds_no_part() -> None:
    """``QueueApp`` assembles (worker/app.py); ``Runner.__init__`` takes it
    built, with run-time options only, and calls no part's constructor."""
    import inspect

    from sqla_queue.worker.aio import AsyncRunner
    from sqla_queue.worker.runner import Runner

    for runner in (Runner, AsyncRunner):
        parameters = inspect.signature(runner.__init__).parameters
        assert [(p.name, p.kind.name) for p in parameters.values()] == [
            ("self", "POSITIONAL_OR_KEYWORD"),
            ("app", "POSITIONAL_OR_KEYWORD"),
            ("burst", "KEYWORD_ONLY"),
        ], runner.__name__
    parts = {
        "QueueApp", "Heartbeat", "TaskManager", "LeasePolicy", "Claims", "FanOut",
        "WebhookStage", "TimeLimiter", "Maintenance", "LaneWakeup", "AsyncLaneWakeup",
        "LimitedClaims", "FairClaims", "PlainClaims", "make_engine", "make_async_engine",
        "adapter_for", "resolve", "wakeups",
    }  # fmt: skip
    tree = ast.parse((PACKAGE / "worker" / "runner.py").read_text(encoding="utf-8"))
    [init] = [
        node
        for runner_class in ast.walk(tree)
        if isinstance(runner_class, ast.ClassDef) and runner_class.name == "Runner"
        for node in runner_class.body
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    ]
    called = {
        call.func.id if isinstance(call.func, ast.Name) else call.func.attr
        for call in ast.walk(init)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name | ast.Attribute)
    }
    assert called & parts == set()


# ------------------------------------------------------------- statements
#: outside ``sqla_queue/adapters/`` (every statement on the queue's tables,
#: per dialect), where a statement may be built or run, and why
STATEMENT_PLACES = {
    "sqla_queue/alembic/": "migrations and `sqla-queue ddl`: their DDL, the rows they write",
    "sqla_queue/schema/mixins.py": "the schema: server defaults written as SQL text",
}
#: SQLAlchemy's statement constructors (dialects' ``insert`` too)
CONSTRUCTORS = {"select", "insert", "update", "delete", "union", "union_all", "text", "exists"}
#: a Table's own: ``table.insert()``, ``table.select()``...
TABLE_STATEMENTS = {"select", "insert", "update", "delete", "exists"}
#: what runs a statement on a Connection or a Session
EXECUTES = {"execute", "exec_driver_sql", "scalar", "scalars"}


def statement_calls(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) of each statement built (a constructor of SQLAlchemy's,
    under any name it was imported as; a Table's ``.insert()`` and the
    like, called without arguments) and each statement run
    (``x.execute(statement)``, ``.exec_driver_sql``, ``.scalar``,
    ``.scalars``, given a statement) in ``source``. Calls on a module that
    is not SQLAlchemy's (``pa.scalar(1)``) and calls with the arguments of
    a namesake (``sys.path.insert(0, x)``, ``values.update(row)``,
    ``result.scalars(0)``) are not statements."""
    tree = ast.parse(source)
    constructors = set(CONSTRUCTORS)
    sqlalchemy_modules: set[str] = set()
    other_modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                ours = alias.name.split(".")[0] == "sqlalchemy"
                (sqlalchemy_modules if ours else other_modules).add(bound)
        elif isinstance(node, ast.ImportFrom):
            ours = (node.module or "").split(".")[0] == "sqlalchemy"
            for alias in node.names:
                bound = alias.asname or alias.name
                if ours and alias.name in CONSTRUCTORS:
                    constructors.add(bound)
                elif ours and alias.name.islower():  # from sqlalchemy.dialects import mysql
                    sqlalchemy_modules.add(bound)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            if func.id in constructors:
                yield node.lineno, f"{func.id}()"
            continue
        if not isinstance(func, ast.Attribute):
            continue
        on = func.value.id if isinstance(func.value, ast.Name) else None
        if on in sqlalchemy_modules and func.attr in CONSTRUCTORS:
            yield node.lineno, f"{on}.{func.attr}()"
        elif on in other_modules:
            continue
        elif func.attr in TABLE_STATEMENTS and not node.args and not node.keywords:
            yield node.lineno, f".{func.attr}()"
        elif func.attr in EXECUTES and node.args:
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, int)):
                yield node.lineno, f".{func.attr}(...)"


def test_the_reader_finds_statements_built_and_run() -> None:
    source = (
        "from sqlalchemy import select as sel, update\n"
        "from sqlalchemy.dialects.postgresql import insert as pg_insert\n"
        "from sqlalchemy.dialects import mysql\n"
        "import sqlalchemy as sa\n"
        "import pyarrow as pa\n"
        "import sys\n"
        "rows = conn.execute(sel(t.c.id))\n"
        "pg_insert(t).on_conflict_do_nothing()\n"
        "mysql.insert(t)\n"
        "sa.delete(t)\n"
        "stmt = t.insert()\n"
        "found = session.scalars(query)\n"
        "conn.exec_driver_sql('PRAGMA busy_timeout = 1')\n"
        "update(t)\n"
        "sys.path.insert(0, here)\n"
        "values.update(row)\n"
        "one = pa.scalar(1)\n"
        "first = result.scalar()\n"
        "ids = result.scalars(0)\n"
        "os.path.exists(path)\n"
    )
    assert sorted({line for line, _ in statement_calls(source)}) == list(range(7, 15))


def _statements_outside_their_places() -> list[str]:
    allowed = ("sqla_queue/adapters/", *STATEMENT_PLACES)
    return [
        f"{path.relative_to(ROOT).as_posix()}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "alembic_templates" not in path.parts
        and not path.relative_to(ROOT).as_posix().startswith(allowed)
        for line, what in statement_calls(path.read_text(encoding="utf-8"))
    ]


def test_statements_are_built_and_run_in_the_adapters() -> None:
    """Every statement on the queue's tables (the queue table, the
    subscribers, the configuration table, the unique keys, the kept
    counts) is built and run in ``sqla_queue/adapters/``; the rest of the
    package reaches them through the adapter and its parts."""
    assert _statements_outside_their_places() == []
