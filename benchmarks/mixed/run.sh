#!/usr/bin/env bash
# The mixed-duration cases for every system in one invocation, repetitions
# interleaved (docs/benchmarks.md#mixed-durations):
#
#   benchmarks/mixed/run.sh [CASES...]     # default: neighbours long-tail bimodal
#
# Environment: REPS (default 3), VENVS (peer venvs, default /tmp/bench-venvs),
# PYTHON (sqla-queue's, default .venv/bin/python), SYSTEMS (default: all five:
# sqla_queue, sqla_queue_async, procrastinate, pgqueuer with batch N/2 and a
# cap of N, pgqueuer with its defaults and an entrypoint limit).
# Results: benchmarks/results/mixed/*.json; then report.py prints the table.
set -euo pipefail
cd "$(dirname "$0")"
HARNESS=$(cd ../../../shared/bench 2>/dev/null && pwd || true)
REPS=${REPS:-3}
VENVS=${VENVS:-/tmp/bench-venvs}
PYTHON=${PYTHON:-../../.venv/bin/python}
SYSTEMS=${SYSTEMS:-"sqla_queue sqla_queue_async procrastinate pgqueuer:cap pgqueuer:eplimit"}
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(neighbours long-tail bimodal)
for peer in procrastinate pgqueuer; do
  if [ ! -x "$VENVS/$peer/bin/python" ]; then
    python3 -m venv "$VENVS/$peer"
    "$VENVS/$peer/bin/pip" install -q --disable-pip-version-check -r "${HARNESS:?../shared/bench is needed for the peers\' pins}/requirements/$peer.txt"
  fi
done
for rep in $(seq 1 "$REPS"); do
  for case in "${CASES[@]}"; do
    for entry in $SYSTEMS; do
      system=${entry%%:*}
      mode=${entry#*:}; [ "$mode" = "$entry" ] && mode=cap
      py=$PYTHON; [[ $system == sqla_queue* ]] || py=$VENVS/$system/bin/python
      tag=r$rep; [ "$system" = pgqueuer ] && tag=$mode.r$rep
      echo "[$(date +%H:%M:%S)] $case $system $tag" >&2
      "$py" bench.py "$system" "$case" "$tag" --pgq-mode "$mode" > /dev/null
    done
  done
done
"$PYTHON" report.py ${MIXED_RESULTS:+"$MIXED_RESULTS"}
