#!/usr/bin/env bash
# The reference library, nsj-queue-lib 1.2.2 from PyPI, in a venv of its own
# (default .cache/nsj-venv, git-ignored; SQLA_QUEUE_NSJ_VENV to move it). The
# compatibility tests (tests/integration/test_nsj_compat.py) drive it only through
# subprocesses of that venv: it pins psycopg2-binary and pytest<8, which must
# stay out of ours. Does nothing when the venv already holds that version.
# When it cannot install (no network, no venv module) it says so and goes on:
# the compatibility tests then skip, or fail under SQLA_QUEUE_REQUIRE_DATABASES=1.
set -u
cd "$(dirname "$0")/.."
VERSION=1.2.2
VENV=${SQLA_QUEUE_NSJ_VENV:-.cache/nsj-venv}
PY=$VENV/bin/python
installed() {
  "$PY" - "$VERSION" 2>/dev/null <<'PYEOF'
import importlib.metadata, sys
sys.exit(importlib.metadata.version("nsj-queue-lib") != sys.argv[1])
PYEOF
}
installed && exit 0
warn() { echo "install-nsj-reference: $* (the nsj-queue-lib compatibility tests will skip)" >&2; exit 0; }
echo "install-nsj-reference: installing nsj-queue-lib==$VERSION into $VENV"
rm -rf "$VENV"
python3 -m venv "$VENV" || warn "python3 -m venv failed"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$VENV/bin/pip" install -q --disable-pip-version-check "nsj-queue-lib==$VERSION" >"$log" 2>&1 \
  || { cat "$log" >&2; rm -rf "$VENV"; warn "pip install nsj-queue-lib==$VERSION failed"; }
installed || { rm -rf "$VENV"; warn "nsj-queue-lib $VERSION not importable after the install"; }
exit 0
