#!/usr/bin/env bash
# Target (a) alone, interleaved: the harness's transactional enqueue (BEGIN,
# one enqueue, COMMIT, on the application's connection) for sqla-queue's ORM
# path, QueueClient.insert_task and the peers, ROUNDS rounds, the order
# rotating each round so that no system always runs first or last.
#
#   benchmarks/enqueue_compare.sh            # 5 rounds of 5,000 jobs each
#   ROUNDS=3 N=3000 SYSTEMS="sqla_queue sqla_queue_client pgqueuer" benchmarks/enqueue_compare.sh
#
# Peers run from $VENVS/<peer> (benchmarks/run.sh or the harness makes them);
# sqla-queue from this checkout's .venv. Prints the median jobs/s of each
# system and its ratio to the best peer; JSON per run under $OUT.
set -euo pipefail
source "$(dirname "$0")/harness.sh"
cd "$ROOT"
ROUNDS=${ROUNDS:-5}
N=${N:-5000}
SYSTEMS=(${SYSTEMS:-sqla_queue sqla_queue_client pgqueuer procrastinate nsj})
OUT=${OUT:-$(mktemp -d /tmp/enqueue_compare.XXXXXX)}
mkdir -p "$OUT"

run() {  # system round
  local s=$1 r=$2
  harness_system "$s"
  (cd "$HARNESS" && PYTHONPATH=$PYPATH "$PY" driver.py --adapter "$ADAPTER" \
    --db "bench_$s" --reps 1 --only a --n-txn "$N" --out "$OUT/$s.$r.json" >/dev/null 2>&1) \
    || echo "enqueue_compare: $s failed in round $r" >&2
}

n=${#SYSTEMS[@]}
for ((r = 0; r < ROUNDS; r++)); do
  for ((i = 0; i < n; i++)); do
    run "${SYSTEMS[$(((i + r) % n))]}" "$r"
  done
done

python3 - "$OUT" "${SYSTEMS[@]}" <<'PY'
import json, statistics, sys
from pathlib import Path

out, systems = Path(sys.argv[1]), sys.argv[2:]

def rates(system):
    found = []
    for path in sorted(out.glob(f"{system}.*.json")):
        data = json.loads(path.read_text())
        found += [run["rate"] for run in data["a"]]
    return found

medians = {s: statistics.median(rates(s)) for s in systems if rates(s)}
peers = {s: m for s, m in medians.items() if not s.startswith("sqla_queue")}
best = max(peers, key=peers.get) if peers else None
print(f"| system | median jobs/s | runs | x best peer ({best}) |")
print("|---|---:|---|---:|")
for s, m in medians.items():
    runs = ", ".join(f"{x:,.0f}" for x in rates(s))
    ratio = f"{m / peers[best]:.2f}" if best else "-"
    print(f"| {s} | {m:,.0f} | {runs} | {ratio} |")
print(f"(JSON in {out})")
PY
