#!/usr/bin/env bash
# sqla-queue's benchmark, in one command from the repository root:
#
#   benchmarks/run.sh                  # everything, 3 repetitions (~35 min)
#
# 1. the peer harness (../shared/bench/run_peers.sh) for sqla_queue and the peers on
#    PostgreSQL: venvs under $VENVS, pgbench floor, (a) (b) (c) (d) per peer
#    -> benchmarks/results/peers/<peer>.json (+ pgbench.json)
# 2. sqla_queue through QueueClient.insert_task, (a) and (b) only, with the
#    harness's driver.py and the sqla_queue venv -> results/peers/sqla_queue_client.json
# 3. benchmarks/own_dialects.py: the same measurements on MariaDB and SQLite
#    -> benchmarks/results/own_dialects.json, own_dialects.md
# 4. the harness's report.py over results/peers -> benchmarks/results/RESULTS.md
# 5. benchmarks/growth.py: (e) claim rate with 5M finished rows, idle worker
#    -> benchmarks/results/growth.json
#    benchmarks/purge.py: (f) purge of 1M finished rows, claim rate beside it
#    -> benchmarks/results/purge.json
# 6. benchmarks/targets.py: issue 4's targets -> benchmarks/results/TARGETS.md
# 7. benchmarks/enqueue_floor.py: one enqueue layer by layer -> results/enqueue_floor.md
# 8. benchmarks/render_docs.py: the tables of docs/benchmarks.md from the files above
#
# The harness's JSON files live in results/peers/ because report.py reads every
# *.json in its folder as a peer (own_dialects.json, growth.json would break it).
#
# Environment:
#   PEERS="sqla_queue pgqueuer"   peers for step 1 (default: sqla_queue pgqueuer
#                                 procrastinate nsj chancy)
#   REPS=1                        repetitions (default 3)
#   SKIP_PGBENCH=1                no pgbench floor
#   DRIVER_ARGS="--n-txn 1000 --n-bulk 10000 --n-proc 5000 --lat-n 100"
#                                 scale options for driver.py, also given to own_dialects.py
#   SKIP_CLIENT=1 SKIP_OWN=1      skip step 2 / step 3
#   SKIP_GROWTH=1                 skip step 5; GROWTH_FINISHED=n finished rows (default 5M)
#   SKIP_PURGE=1                  skip (f) in step 5; PURGE_ROWS=n rows (default 1M)
#   SKIP_FLOOR=1                  skip step 7
#   SKIP_DOCS=1                   skip step 8 (a smoke run should not rewrite the docs' tables)
#   OWN_ARGS="--dialects sqlite"  more own_dialects.py options (--poll-interval, --mysql-url)
#   BENCH_HARNESS=/path/to/bench  the harness (default: ../shared/bench from the repo root)
#   RESULTS=dir                   output folder (default: benchmarks/results)
#   VENVS=dir                     peer venvs (default: /tmp/bench-venvs)
#
# Quick smoke test (~4 min):
#   SKIP_DOCS=1 REPS=1 SKIP_PGBENCH=1 PEERS="sqla_queue pgqueuer" \
#     DRIVER_ARGS="--n-txn 1000 --n-bulk 10000 --n-proc 5000 --lat-n 100" benchmarks/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HARNESS=$(cd "${BENCH_HARNESS:-$ROOT/../shared/bench}" && pwd)
RESULTS=${RESULTS:-benchmarks/results}
mkdir -p "$RESULTS/peers"
RESULTS=$(cd "$RESULTS" && pwd)
PEER_RESULTS=$RESULTS/peers
export VENVS=${VENVS:-/tmp/bench-venvs}
PEERS=${PEERS:-"sqla_queue pgqueuer procrastinate nsj chancy"}
REPS=${REPS:-3}
PY=$VENVS/sqla_queue/bin/python
log() { echo "[$(date +%H:%M:%S)] $*"; }

# 1. peers (builds the sqla_queue venv, editable, when sqla_queue is in PEERS)
# the drivers are extras: [postgresql,mysql] for the PostgreSQL and MariaDB runs
ADAPTER_PATH=benchmarks/peers RESULTS=$PEER_RESULTS INSTALL_sqla_queue="-e $ROOT[postgresql,mysql]" \
  PEERS=$PEERS REPS=$REPS "$HARNESS/run_peers.sh"
rm -f "$PEER_RESULTS/RESULTS.md"  # step 4 writes the complete one

if [ -z "${SKIP_CLIENT:-}" ] || [ -z "${SKIP_OWN:-}" ] || [ -z "${SKIP_GROWTH:-}" ]; then
  if [ ! -x "$PY" ]; then
    log "creating venv $VENVS/sqla_queue"
    python3 -m venv "$VENVS/sqla_queue"
    "$VENVS/sqla_queue/bin/pip" install -q --disable-pip-version-check -e "$ROOT[postgresql,mysql]"
  fi
fi

# 2. QueueClient.insert_task: (a) and (b) through the harness's driver
if [ -z "${SKIP_CLIENT:-}" ]; then
  log "peer sqla_queue (QueueClient), --only a,b"
  # shellcheck disable=SC2086  # DRIVER_ARGS is a list of options
  PYTHONPATH="$ROOT/benchmarks/peers${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$HARNESS/driver.py" \
    --adapter sqla_queue_client_adapter --db bench_sqla_queue_client --reps "$REPS" \
    --out "$PEER_RESULTS/sqla_queue_client.json" ${DRIVER_ARGS:-} --only a,b \
    || log "driver for sqla_queue (QueueClient) exited with an error (see above); continuing"
  # (c) and (d) were not run: drop their empty entries, which report.py would list as failed
  "$PY" - "$PEER_RESULTS/sqla_queue_client.json" <<'EOF' || true
import json, sys
path = sys.argv[1]
with open(path) as f:
    res = json.load(f)
for key in ("c", "d"):
    if not any(res[key].values()):
        res[key] = {}
with open(path, "w") as f:
    json.dump(res, f, indent=1)
EOF
fi

# 3. MariaDB and SQLite
if [ -z "${SKIP_OWN:-}" ]; then
  log "own dialects: MariaDB, SQLite"
  scripts/start-databases.sh
  # shellcheck disable=SC2086
  BENCH_HARNESS=$HARNESS "$PY" benchmarks/own_dialects.py --results "$RESULTS" --reps "$REPS" \
    ${DRIVER_ARGS:-} ${OWN_ARGS:-} \
    || log "own_dialects.py reported failed measurements (see above); continuing"
fi

# 4. the report over every peer result
python3 "$HARNESS/report.py" --results "$PEER_RESULTS" --out "$RESULTS/RESULTS.md"

# 5. (e) cost growth with 5M finished rows, and the idle worker's RSS and CPU
if [ -z "${SKIP_GROWTH:-}" ]; then
  log "growth: claim rate empty vs. ${GROWTH_FINISHED:-5000000} finished rows; idle worker"
  "$PY" benchmarks/growth.py --results "$RESULTS" --reps "$REPS" \
    --finished "${GROWTH_FINISHED:-5000000}" \
    || log "growth.py failed (see above)"
fi
if [ -z "${SKIP_PURGE:-}" ]; then
  log "purge: ${PURGE_ROWS:-1000000} finished rows, and the claim rate beside it"
  "$PY" benchmarks/purge.py --results "$RESULTS" --rows "${PURGE_ROWS:-1000000}" \
    || log "purge.py failed (see above)"
fi

# 6. the issue's targets, from the files above
python3 benchmarks/targets.py --results "$RESULTS" > "$RESULTS/TARGETS.md" || true
cat "$RESULTS/TARGETS.md"

# 7. one enqueue, layer by layer: driver, SQLAlchemy Core, ORM, sqla-queue
if [ -z "${SKIP_FLOOR:-}" ]; then
  log "enqueue floor"
  "$PY" benchmarks/enqueue_floor.py > "$RESULTS/enqueue_floor.md" || log "enqueue_floor.py failed"
fi

# 8. the tables of docs/benchmarks.md, from this run (only for the default results folder)
if [ -z "${SKIP_DOCS:-}" ] && [ "$RESULTS" = "$ROOT/benchmarks/results" ]; then
  python3 benchmarks/render_docs.py --results "$RESULTS" --doc docs/benchmarks.md
fi
