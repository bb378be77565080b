"""Who uses the CPU during a long-horizon run: every 10 seconds, the cores
used by the worker, the enqueuer, the PostgreSQL backends and the rest,
from /proc (Linux), and the machine's busy and steal shares.

    python benchmarks/cpu_by_process.py [--seconds 800] [--out cpu.jsonl] &
    .venv/bin/python benchmarks/long_horizon.py --minutes 12 --autovacuum on \\
        --pin-horizon-minutes 2:9 --systems sqla_queue --output lh.json

One JSON object a line: ``{"t": seconds, "busy": share, "steal": share,
"cores": {"postgres": n, "worker": n, "enqueuer": n, ...}}``. Used for
docs/benchmarks.md (g), "Why the enqueue slowed under the pin".
"""

from __future__ import annotations

import argparse
import json
import os
import time

TICKS = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[str, tuple[str, int]]:
    """pid -> (command line, CPU ticks so far)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        found[pid] = (command, int(fields[11]) + int(fields[12]))  # utime + stime
    return found


def _kind(command: str) -> str:
    if " worker " in command:
        return "worker"
    if "_enqueue" in command:
        return "enqueuer"
    if command.startswith("postgres"):
        return "postgres"
    return "other"


def _machine() -> tuple[int, int, int]:
    """(all ticks, idle + iowait ticks, steal ticks) since boot."""
    with open("/proc/stat") as f:
        fields = [int(n) for n in f.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4], fields[7]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=800)
    parser.add_argument("--every", type=float, default=10)
    parser.add_argument("--out", default="cpu.jsonl")
    args = parser.parse_args()
    before, machine = _processes(), _machine()
    started = time.monotonic()
    with open(args.out, "a") as out:
        while time.monotonic() - started < args.seconds:
            time.sleep(args.every)  # a sampling period, not a wait for an event
            now, machine_now = _processes(), _machine()
            cores: dict[str, float] = {}
            for pid, (command, ticks) in now.items():
                if pid in before:  # a process born in the period: not counted
                    used = (ticks - before[pid][1]) / TICKS / args.every
                    cores[_kind(command)] = cores.get(_kind(command), 0.0) + used
            total = machine_now[0] - machine[0]
            record = {
                "t": round(time.monotonic() - started),
                "busy": round(1 - (machine_now[1] - machine[1]) / total, 3),
                "steal": round((machine_now[2] - machine[2]) / total, 3),
                "cores": {kind: round(n, 2) for kind, n in cores.items()},
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
            before, machine = now, machine_now
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
