#!/usr/bin/env bash
# Processing (c) and latency (d) of two sqla-queue commits and the fastest
# peer, in one run, for a change to a hot path (the claim, the completion):
#
#   benchmarks/before_after.sh BEFORE_COMMIT [AFTER_COMMIT]   # default AFTER: HEAD
#
# Each commit is checked out into a temporary worktree and installed into a
# venv of its own; then the harness's driver runs (c) and (d) for BEFORE,
# AFTER and the peer, repetitions interleaved. Results: $RESULTS/before.N.json,
# after.N.json, <peer>.N.json and a table on stdout.
#
# Environment: PEER (default pgqueuer), REPS (default 3), DRIVER_ARGS (more
# driver.py options), BENCH_HARNESS (default ../shared/bench), VENVS (default
# /tmp/bench-venvs), RESULTS (default benchmarks/results/before_after).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BEFORE=${1:?usage: benchmarks/before_after.sh BEFORE_COMMIT [AFTER_COMMIT]}
AFTER=${2:-HEAD}
HARNESS=$(cd "${BENCH_HARNESS:-$ROOT/../shared/bench}" && pwd)
PEER=${PEER:-pgqueuer}
REPS=${REPS:-3}
VENVS=${VENVS:-/tmp/bench-venvs}
RESULTS=${RESULTS:-benchmarks/results/before_after}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
WORK=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$WORK/before" 2>/dev/null || true;
      git -C "$ROOT" worktree remove --force "$WORK/after" 2>/dev/null || true; rm -rf "$WORK"' EXIT
log() { echo "[$(date +%H:%M:%S)] $*"; }

for side in before after; do
  commit=$BEFORE; [ "$side" = after ] && commit=$AFTER
  git worktree add -q --detach "$WORK/$side" "$commit"
  venv=$VENVS/sqla_queue_$side
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -e "$WORK/$side[postgresql]" 2>/dev/null \
    || "$venv/bin/pip" install -q --disable-pip-version-check -e "$WORK/$side"
done
if [ ! -x "$VENVS/$PEER/bin/python" ]; then
  python3 -m venv "$VENVS/$PEER"
  "$VENVS/$PEER/bin/pip" install -q --disable-pip-version-check -r "$HARNESS/requirements/$PEER.txt"
fi

cd "$HARNESS"
run_side() {  # run_side before|after|peer REP
  if [ "$1" = peer ]; then
    log "rep $2: peer $PEER"
    # shellcheck disable=SC2086  # DRIVER_ARGS is a list of options
    PYTHONPATH="$HARNESS/adapters" "$VENVS/$PEER/bin/python" driver.py --adapter "${PEER}_adapter" \
      --db "bench_$PEER" --reps 1 --only c,d --out "$RESULTS/$PEER.$2.json" ${DRIVER_ARGS:-}
  else
    log "rep $2: sqla_queue $1 ($(git -C "$WORK/$1" rev-parse --short HEAD))"
    # shellcheck disable=SC2086
    PYTHONPATH="$WORK/$1/benchmarks/peers" "$VENVS/sqla_queue_$1/bin/python" driver.py \
      --adapter sqla_queue_adapter --db "bench_sqla_queue_$1" --reps 1 --only c,d \
      --out "$RESULTS/$1.$2.json" ${DRIVER_ARGS:-}
  fi
}

# repetitions interleave the three, and each repetition starts one place
# further along (before after peer, after peer before, peer before after):
# the machine drifts during a run (2026-11-23: the same commit's rate fell
# by a third from its first repetition to its third), and a side measured
# all at once, or always first, would carry the drift as if it were its own
ORDER=(before after peer)
for rep in $(seq 1 "$REPS"); do
  shift_by=$(((rep - 1) % 3))
  for i in 0 1 2; do
    run_side "${ORDER[$(((i + shift_by) % 3))]}" "$rep"
  done
done

python3 - "$RESULTS" "$PEER" <<'EOF'
import json, pathlib, statistics, sys
results, peer = pathlib.Path(sys.argv[1]), sys.argv[2]
print("| run | setting | (c) tasks/s, median | (d) p50 ms | (d) p99 ms |")
print("|---|---|---|---|---|")
for name in ("before", "after", peer):
    reps = [json.loads(path.read_text()) for path in sorted(results.glob(f"{name}.*.json"))]
    data = reps[0]
    latency: dict = {}
    processing: dict = {}
    for rep in reps:
        for setting, runs in rep.get("d", {}).items():
            latency.setdefault(setting, []).extend(runs)
        for setting, runs in rep.get("c", {}).items():
            processing.setdefault(setting, []).extend(runs)
    for setting, runs in processing.items():
        rate = statistics.median(r["rate"] for r in runs)
        lat = latency.get(setting)
        p50 = f"{statistics.median(r['p50'] for r in lat):.2f}" if lat else ""
        p99 = f"{statistics.median(r['p99'] for r in lat):.2f}" if lat else ""
        print(f"| {name} {data.get('version', '')} | {setting} | {rate:,.0f} | {p50} | {p99} |")
EOF
