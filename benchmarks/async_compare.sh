#!/usr/bin/env bash
# No-op tasks: sqla-queue's sync worker, its async worker (async def execute),
# pgqueuer and procrastinate (both async), in one run of the peer harness:
# (c) processing and (d) latency (DRIVER_ARGS="--only c,d" by default).
#
#   benchmarks/async_compare.sh          # REPS=3, ~15 min
#
# Output: benchmarks/results/async_compare/<date>/ (one JSON per system and
# the harness's RESULTS.md). The venvs are the harness's (/tmp/bench-venvs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HARNESS=$(cd "${BENCH_HARNESS:-$ROOT/../shared/bench}" && pwd)
OUT=${OUT:-benchmarks/results/async_compare/$(date -u +%Y-%m-%d-%H%M)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPS=${REPS:-3}
export VENVS=${VENVS:-/tmp/bench-venvs}
export DRIVER_ARGS=${DRIVER_ARGS:-"--only c,d"}
# sqla_queue's venv gets the postgresql extra: psycopg, and greenlet for the async worker
ADAPTER_PATH=benchmarks/peers RESULTS=$OUT INSTALL_sqla_queue="-e $ROOT[postgresql]" \
  PEERS="sqla_queue pgqueuer procrastinate" REPS=$REPS SKIP_PGBENCH=1 "$HARNESS/run_peers.sh"
echo "[$(date +%H:%M:%S)] peer sqla_queue (async)"
# shellcheck disable=SC2086  # DRIVER_ARGS is a list of options
(cd "$HARNESS" && PYTHONPATH="$ROOT/benchmarks/peers" "$VENVS/sqla_queue/bin/python" driver.py \
  --adapter sqla_queue_async_adapter --db bench_sqla_queue_async --reps "$REPS" \
  --out "$OUT/sqla_queue_async.json" $DRIVER_ARGS)
(cd "$HARNESS" && python3 report.py --results "$OUT" --out "$OUT/RESULTS.md")
echo "$OUT/RESULTS.md"
