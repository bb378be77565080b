"""The package's shape, read from its source: no import circle, and the core
never imports the features built on it.

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
#: the modules and packages every other part builds on
CORE = (
    "manager",
    "adapters",
    "mixins",
    "events",
    "client",
    "records",
    "payload",
    "leases",
    "retry",
)
#: the parts built on the core
FEATURES = ("worker", "server", "spark", "alembic", "cli", "ops")


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


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def core_to_feature(graph: dict[str, set[str]]) -> Iterator[tuple[str, str]]:
    for module, imported in sorted(graph.items()):
        if _top(module) in CORE:
            for other in sorted(imported):
                if _top(other) in FEATURES:
                    yield module, other


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The reader itself: a function-level import and a TYPE_CHECKING one
    are edges (the manager's type-only import of the webhook worker was one
    of the circles this test was written against)."""
    graph = import_graph()
    assert "sqla_queue.worker.runner" in graph["sqla_queue.worker.base"]  # inside run()
    assert "sqla_queue.settings" in graph["sqla_queue.resolution"]  # TYPE_CHECKING only
    assert "sqla_queue.worker.providers" in graph["sqla_queue.worker.runner"]  # from . import
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_the_core_imports_no_feature() -> None:
    assert list(core_to_feature(import_graph())) == []


# ------------------------------------------------------------- dialect code
#: where SQL text and tests of the dialect belong, and why
DIALECT_PLACES = {
    "sqla_queue/adapters/": "every statement on the queue, per dialect",
    "sqla_queue/ddl.py": "the CREATE statements",
    "sqla_queue/ddl_singlestore.py": "SingleStore's CREATE TABLE options",
    "sqla_queue/alembic/": "the migration operations",
    "sqla_queue/mixins.py": "the schema",
    "sqla_queue/types.py": "the schema's column types",
    "sqla_queue/settings.py": "URLs and drivers, before any adapter exists",
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
