#!/usr/bin/env bash
# The package as a user gets it (make check-package, .ci/run): builds the
# sdist and the wheel with `python -m build` (the wheel from the unpacked
# sdist, so a file the sdist lacks fails here, and no leftover of a build in
# the checkout's build/ can slip into it), checks both with `twine check
# --strict`, installs the wheel with every extra but singlestore into a
# fresh venv, and from a folder outside the checkout (so Python imports the
# installed package, never the checkout's) runs the quick start, `sqla-queue
# alembic init` (the alembic templates, package data) and an import of each
# extra's modules (the dashboard's pages, metrics, traces, Spark), and finds
# py.typed and the Spark log configuration.
#
# Not singlestore: no server here to talk to. spark's PySpark is a 460 MB
# wheel: about 15 s to install from pip's cache, which make test (.[dev])
# fills first in .ci/run; imported only, no JVM started.
#
# PYTHON: the interpreter that builds and makes the venv (default: .venv's,
# which has build and twine: the dev extra). KEEP=1 keeps the temp folder.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
EXTRAS=postgresql,mysql,sqlite,metrics,otel,dashboard,spark
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sqla-queue-package.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
    echo "check-package: keeping $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi
step() { echo "check-package: $*"; }

step "building the sdist and the wheel"
"$PYTHON" -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || {
    cat "$WORK/build.log"
    exit 1
}
SDIST=$(echo "$WORK"/dist/sqla_queue-*.tar.gz)
WHEEL=$(echo "$WORK"/dist/sqla_queue-*-py3-none-any.whl)
[ -f "$SDIST" ] && [ -f "$WHEEL" ] || { echo "no sdist or wheel in $WORK/dist" >&2; exit 1; }

step "twine check"
"$PYTHON" -m twine check --strict "$SDIST" "$WHEEL"

step "the wheel holds the checkout's package, every file of it and nothing else"
"$PYTHON" - "$WHEEL" "$ROOT/sqla_queue" <<'EOF'
import sys
import zipfile
from pathlib import Path

wheel, package = sys.argv[1], Path(sys.argv[2])
shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("sqla_queue/")}
source = {
    p.relative_to(package.parent).as_posix()
    for p in package.rglob("*")
    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
}
missing, extra = sorted(source - shipped), sorted(shipped - source)
if missing or extra:
    sys.exit(f"the wheel lacks {missing} and has besides {extra}")
print(f"  {len(shipped)} files")
EOF

step "a fresh venv with sqla-queue[$EXTRAS] from the wheel"
"$PYTHON" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
"$WORK/venv/bin/pip" install -q --disable-pip-version-check "$WHEEL[$EXTRAS]"

# outside the checkout, with nothing of it on the path
RUN=$WORK/run
mkdir -p "$RUN/examples"
cp examples/__init__.py examples/quickstart.py "$RUN/examples/"
cd "$RUN"
unset PYTHONPATH SQLA_QUEUE_URL

step "the installed package is the one imported"
"$VPY" - "$WORK/venv" <<'EOF'
import sys
from importlib import resources
from pathlib import Path

import sqla_queue

where = Path(sqla_queue.__file__).resolve()
if Path(sys.argv[1]).resolve() not in where.parents:
    sys.exit(f"sqla_queue imported from {where}, not from the fresh venv")
# package data: py.typed; the dashboard's pages are Python (assets.py)
assert resources.files("sqla_queue").joinpath("py.typed").is_file(), "no py.typed"
assert resources.files("sqla_queue.spark").joinpath("log4j2.properties").is_file()
from sqla_queue.ops.dashboard import assets, create_app  # noqa: F401  (the extra's imports)

assert "base.html" in assets.TEMPLATES and assets.CSS and assets.JS
import sqla_queue.ops.metrics, sqla_queue.ops.tracing  # noqa: E401, F401  (metrics, otel)
import sqla_queue.spark.analytics, sqla_queue.spark.session, pyspark.sql  # noqa: E401, F401
print(f"  {where.parent}")
EOF

step "the quick start, with the venv's python"
"$VPY" examples/quickstart.py | tee "$WORK/quickstart.log"
grep -q "status=sucesso" "$WORK/quickstart.log"
grep -q "faturada=True" "$WORK/quickstart.log"

step "sqla-queue alembic init (the templates)"
"$WORK/venv/bin/sqla-queue" alembic init migrations --metadata examples.quickstart:Base.metadata
for file in alembic.ini migrations/env.py migrations/script.py.mako migrations/README; do
    [ -f "$file" ] || { echo "alembic init made no $file" >&2; exit 1; }
done

step "ok"
