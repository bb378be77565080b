#!/usr/bin/env bash
# Instructions one transactional enqueue costs the client, per system
# (valgrind's callgrind: a count, not a time, so the same on a busy or a
# quiet machine and between runs; the server's work is not in it):
# benchmarks/enqueue_loop.py run with N enqueues and with 0, the
# difference divided by N. Compare with the wall times of
# enqueue_compare.sh: fewer instructions in Python spread over more code
# can still cost more CPU time than a C driver's (docs/benchmarks.md).
#
#   benchmarks/enqueue_instructions.sh
#   N=2000 SYSTEMS="sqla_queue_client nsj" benchmarks/enqueue_instructions.sh
set -euo pipefail
source "$(dirname "$0")/harness.sh"
cd "$ROOT"
N=${N:-1000}
SYSTEMS=(${SYSTEMS:-sqla_queue sqla_queue_client pgqueuer procrastinate nsj})
OUT=$(mktemp -d /tmp/enqueue_instructions.XXXXXX)

count() {  # system n -> instructions of the whole run
  local s=$1 n=$2
  harness_system "$s"
  (cd "$HARNESS" && PYTHONPATH=$PYPATH valgrind --tool=callgrind \
    --callgrind-out-file=/dev/null "$PY" "$ROOT/benchmarks/enqueue_loop.py" \
    --adapter "$ADAPTER" --db "bench_insn_${s}_$n" --n "$n" >"$OUT/$s.$n.log" 2>&1) \
    || { echo "enqueue_instructions: $s failed (see $OUT/$s.$n.log)" >&2; return 1; }
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT/$s.$n.log"
}

echo "| system | instructions an enqueue (client) |"
echo "|---|---:|"
for s in "${SYSTEMS[@]}"; do
  base=$(count "$s" 0) && full=$(count "$s" "$N") || continue
  printf '| %s | %s |\n' "$s" "$(( (full - base) / N ))"
done
