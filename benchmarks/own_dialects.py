"""sqla-queue on its other databases: the peer benchmark's measurements on
MariaDB and SQLite (PostgreSQL is covered by the peer harness itself).

    python benchmarks/own_dialects.py [--reps 3] [--dialects mariadb,sqlite]
        [--n-txn 5000] [--n-bulk 50000] [--n-proc 20000] [--lat-n 500] ...

Measurements, with the harness's own timing code (driver.py's measure_*
functions, run against benchmarks/peers/sqla_queue_adapter.py pointed at the
other database):

  a   ORM enqueue, one transaction per task (Session + s.add(Task(...)))
  a'  QueueClient.insert_task on a long-lived Connection, one transaction per task
  b   QueueClient.insert_tasks, chunks of 1,000 per transaction
  c   processing N pre-loaded no-op tasks with 1 worker process and with 4
      (``python -m sqla_queue_adapter worker``; timed from the start of the
      processes until all are ``sucesso``, capped at --proc-cap seconds)
  d   latency: tasks at a steady rate to an idle worker; body start - COMMIT.
      MariaDB and SQLite have no LISTEN/NOTIFY: the worker polls, every
      --poll-interval seconds here (SQLA_QUEUE_POLL_INTERVAL; default 1 s).

The queue table is ``bench_fila_own`` (dropped before and after); SQLite
uses a file under /tmp. Each measurement runs --reps times (interleaved as
in the harness); the tables show median / min / max. Writes
<results>/own_dialects.json and <results>/own_dialects.md (results:
benchmarks/results; the harness's peer JSON files are under results/peers/,
because its report.py reads every *.json in its folder as a peer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "benchmarks" / "peers"
HARNESS = Path(os.environ.get("BENCH_HARNESS") or ROOT.parent / "shared" / "bench").resolve()
TABLE = "bench_fila_own"
DEFAULT_URLS = {
    "mariadb": os.environ.get("BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "sqlite": "sqlite:////tmp/sqla-queue-bench-own/bench.db",
}

# Read at import by the adapter and benchlib, and inherited by worker processes.
os.environ["BENCH_SQLA_QUEUE_TABLE"] = TABLE
os.environ.setdefault("BENCH_LOG_DIR", "/tmp/bench-logs/own_dialects")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(PEERS_DIR), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
)
sys.path[:0] = [str(HARNESS), str(PEERS_DIR)]

import benchlib  # noqa: E402
import driver  # noqa: E402  (the harness's timing code)
import sqla_queue_adapter as orm  # noqa: E402
import sqla_queue_client_adapter as client  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from sqla_queue import normalize_url  # noqa: E402

PROCESSING_SETTINGS = [orm.WORKER_SETTINGS[0], orm.WORKER_SETTINGS[-1]]  # 1 proc, 4 procs
LATENCY_SETTING = orm.WORKER_SETTINGS[orm.LATENCY_SETTING]
SERVER_PROCESS = {"mariadb": "mariadbd"}  # its CPU is the workload's, not noise
THROUGHPUT_ROWS = [
    ("a", "ORM enqueue, 1 txn/task", "a_orm"),
    ("a'", "QueueClient.insert_task, 1 txn/task", "a_client"),
    ("b", "QueueClient.insert_tasks, chunks of 1,000", "b"),
]


def fresh(name: str, url: str) -> str:
    """Drop what a previous run left; the server's version."""
    if name == "sqlite":
        path = Path(normalize_url(url).database or "")
        shutil.rmtree(path.parent, ignore_errors=True)
        path.parent.mkdir(parents=True)
        return f"SQLite {sqlite3.sqlite_version}"
    engine = create_engine(normalize_url(url))
    try:
        orm.Base.metadata.drop_all(engine)
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT VERSION()")).scalar())
    finally:
        engine.dispose()


def cleanup(name: str, url: str) -> None:
    if name == "sqlite":
        shutil.rmtree(Path(normalize_url(url).database or "").parent, ignore_errors=True)
    else:
        fresh(name, url)


def machine_noise(probe: benchlib.NoiseProbe, own_server: str | None) -> dict[str, Any]:
    """The probe's figures, without the database server's own CPU: the probe
    only knows PostgreSQL's processes, but mariadbd is part of the workload."""
    machine = probe.finish()
    if own_server:
        own = sum(
            float(t.split(":")[1]) for t in machine["foreign_top"] if t.split(":")[0] == own_server
        )
        machine["server_cores"] = own
        machine["foreign_cores_incl_server"] = machine["foreign_cores"]
        machine["foreign_cores"] = max(0.0, machine["foreign_cores"] - own)
        machine["foreign_top"] = [
            t for t in machine["foreign_top"] if t.split(":")[0] != own_server
        ]
    return machine


def attempt(
    label: str,
    fn: Callable[[], dict[str, Any]],
    sink: list[dict[str, Any]],
    errors: list[dict[str, str]],
    own_server: str | None,
) -> None:
    started = time.perf_counter()
    try:
        probe = benchlib.NoiseProbe()
        result = fn()
        result["machine"] = machine_noise(probe, own_server)
        sink.append(result)
        driver.log(
            f"{label}: "
            + ", ".join(
                f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in result.items()
                if k != "machine"
            )
            + f"  foreign_cores={result['machine']['foreign_cores']:.2f}"
            + f" {result['machine']['foreign_top']}"
            + f"  ({time.perf_counter() - started:.1f}s)"
        )
    except Exception as exc:  # record it and go on, as the harness does
        errors.append({"what": label, "error": repr(exc), "trace": traceback.format_exc()[-2000:]})
        driver.log(f"{label}: FAILED {exc!r}")
        orm.recover()


def latency(n: int, rate: float, poll_interval: float) -> dict[str, Any]:
    previous = os.environ.get("SQLA_QUEUE_POLL_INTERVAL")
    os.environ["SQLA_QUEUE_POLL_INTERVAL"] = str(poll_interval)  # inherited by the worker
    try:
        return driver.measure_latency(orm, LATENCY_SETTING, n, rate)
    finally:
        if previous is None:
            os.environ.pop("SQLA_QUEUE_POLL_INTERVAL", None)
        else:
            os.environ["SQLA_QUEUE_POLL_INTERVAL"] = previous


def run_dialect(name: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    only = set(args.only.split(","))
    res: dict[str, Any] = {
        "url": url,
        "server": fresh(name, url),
        "a_orm": [],
        "a_client": [],
        "b": [],
        "c": {s["label"]: [] for s in PROCESSING_SETTINGS},
        "d": {LATENCY_SETTING["label"]: []},
        "errors": [],
    }
    driver.log(f"{name}: {res['server']} at {url}, table {TABLE}")
    orm.setup(url)

    def run(label: str, fn: Callable[[], dict[str, Any]], sink: list[dict[str, Any]]) -> None:
        attempt(f"{name} {label}", fn, sink, res["errors"], SERVER_PROCESS.get(name))

    try:
        for rep in range(1, args.reps + 1):
            if "a" in only:
                run(
                    f"rep{rep} a ORM enqueue",
                    lambda: driver.measure_txn_enqueue(orm, args.n_txn),
                    res["a_orm"],
                )
                run(
                    f"rep{rep} a' QueueClient.insert_task",
                    lambda: driver.measure_txn_enqueue(client, args.n_txn),
                    res["a_client"],
                )
            if "b" in only:
                run(
                    f"rep{rep} b insert_tasks",
                    lambda: driver.measure_bulk_enqueue(orm, args.n_bulk),
                    res["b"],
                )
            if "c" in only:
                for s in PROCESSING_SETTINGS:
                    run(
                        f"rep{rep} c processing [{s['label']}]",
                        lambda s=s: driver.measure_processing(orm, args.n_proc, s, args.proc_cap),
                        res["c"][s["label"]],
                    )
            if "d" in only:
                run(
                    f"rep{rep} d latency [{LATENCY_SETTING['label']}, poll {args.poll_interval} s]",
                    lambda: latency(args.lat_n, args.lat_rate, args.poll_interval),
                    res["d"][LATENCY_SETTING["label"]],
                )
    finally:
        orm.teardown()
        if not args.keep_db:
            cleanup(name, url)
    return res


# ---------------------------------------------------------------- report


def fmt(x: float | None, nd: int = 0) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def mmm(values: list[float], nd: int = 0) -> list[str]:
    values = [v for v in values if v is not None]
    if not values:
        return ["–", "–", "–"]
    return [fmt(statistics.median(values), nd), fmt(min(values), nd), fmt(max(values), nd)]


def noise(runs: list[dict[str, Any]]) -> str:
    cores = [r["machine"]["foreign_cores"] for r in runs if "machine" in r]
    return f"{statistics.median(cores):.2f} ({max(cores):.2f})" if cores else "–"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]


def render(out: dict[str, Any]) -> str:
    p = out["params"]
    md = [
        "# sqla-queue on MariaDB and SQLite",
        "",
        "Generated by `benchmarks/own_dialects.py` "
        f"({out['started']} → {out.get('finished', '?')}, sqla-queue {out['version']}, "
        f"Python {out['python']}). The peer benchmark's "
        "measurements (the harness's driver.py timing code, through "
        "`benchmarks/peers/sqla_queue_adapter.py`) on the databases the PostgreSQL-only "
        f"harness does not cover. Every cell: median / min / max of {p['reps']} "
        "repetitions. 'foreign cores': CPU used by other workloads on the machine during "
        "the measurement (benchlib.NoiseProbe; on the MariaDB rows without mariadbd, "
        "which serves the benchmark itself), in cores, median (max).",
        "",
        "Databases: "
        + "; ".join(f"{name}: {d['server']} (`{d['url']}`)" for name, d in out["dialects"].items())
        + ".",
        "",
    ]
    md += [
        "## Enqueue and processing (jobs/s, higher is better)",
        "",
        f"(a), (a'): {p['n_txn']:,} tasks from one client, one transaction each. "
        f"(b): {p['n_bulk']:,} tasks. (c): {p['n_proc']:,} pre-loaded no-op tasks, timed "
        "from starting the worker processes until all are `sucesso` (startup included; "
        f"capped at {p['proc_cap_s']:.0f} s, then completed/elapsed and 'done' shows how "
        "many). Workers poll when idle (default 1 s interval).",
        "",
    ]
    rows: list[list[Any]] = []
    for name, d in out["dialects"].items():
        for key, what, field in THROUGHPUT_ROWS:
            runs = d[field]
            rows.append([name, key, what, *mmm([r["rate"] for r in runs]), "", noise(runs)])
        for label, runs in d["c"].items():
            done = [r["done"] for r in runs]
            n = p["n_proc"]
            done_s = (
                f"{n:,}/{n:,}"
                if done and all(x >= n for x in done)
                else " / ".join(f"{x:,}" for x in done) or "failed"
            )
            rows.append(
                [
                    name,
                    "c",
                    f"processing, {label}",
                    *mmm([r["rate"] for r in runs]),
                    done_s,
                    noise(runs),
                ]
            )
    md += [
        *table(
            ["database", "", "measurement", "median", "min", "max", "done", "foreign cores"], rows
        ),
        "",
    ]

    md += [
        f"## (d) Latency — {p['lat_n']} tasks at {p['lat_rate']:.0f}/s to an idle worker",
        "",
        "ms from the enqueueing COMMIT returning to the task body starting; median of the "
        "per-run percentile (min–max over runs). The worker polls every "
        f"**{p['poll_interval_s']} s** (`SQLA_QUEUE_POLL_INTERVAL={p['poll_interval_s']}`; "
        "the default is 1 s): MariaDB and SQLite have no LISTEN/NOTIFY.",
        "",
    ]
    rows = []
    for name, d in out["dialects"].items():
        for label, runs in d["d"].items():

            def cell(k: str, runs: list[dict[str, Any]] = runs) -> str:
                m, lo, hi = mmm([r[k] for r in runs], 1)
                return f"{m} ({lo}–{hi})"

            received = " / ".join(str(r["received"]) for r in runs) or "failed"
            rows.append(
                [
                    name,
                    label,
                    cell("p50"),
                    cell("p95"),
                    cell("p99"),
                    f"{received} of {p['lat_n']}",
                    noise(runs),
                ]
            )
    md += [
        *table(
            ["database", "setting", "p50 ms", "p95 ms", "p99 ms", "received", "foreign cores"], rows
        ),
        "",
    ]

    errors = [(name, e) for name, d in out["dialects"].items() for e in d["errors"]]
    md += ["## Failed measurements", ""]
    md += [f"- {name}: {e['what']}: `{e['error']}`" for name, e in errors] or [
        "None: every measurement completed."
    ]
    return "\n".join(md) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dialects", default="mariadb,sqlite")
    ap.add_argument("--mysql-url", default=DEFAULT_URLS["mariadb"])
    ap.add_argument("--sqlite-url", default=DEFAULT_URLS["sqlite"])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    # the harness driver's options, so run.sh can pass DRIVER_ARGS to both
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="a,b,c,d", help="a (a and a'), b, c, d")
    ap.add_argument("--n-txn", type=int, default=5000)
    ap.add_argument("--n-bulk", type=int, default=50000)
    ap.add_argument("--n-proc", type=int, default=20000)
    ap.add_argument("--proc-cap", type=float, default=30)
    ap.add_argument("--lat-n", type=int, default=500)
    ap.add_argument("--lat-rate", type=float, default=50.0)
    ap.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="SQLA_QUEUE_POLL_INTERVAL for the latency worker (seconds)",
    )
    ap.add_argument("--keep-db", action="store_true", help="keep the table / SQLite file")
    args = ap.parse_args()

    urls = {"mariadb": args.mysql_url, "sqlite": args.sqlite_url}
    out: dict[str, Any] = {
        "version": orm.version(),
        "python": sys.version.split()[0],
        "params": {
            "reps": args.reps,
            "n_txn": args.n_txn,
            "n_bulk": args.n_bulk,
            "n_proc": args.n_proc,
            "proc_cap_s": args.proc_cap,
            "lat_n": args.lat_n,
            "lat_rate": args.lat_rate,
            "poll_interval_s": args.poll_interval,
            "bulk_chunk": orm.BULK_CHUNK,
            "processing_settings": PROCESSING_SETTINGS,
            "latency_setting": LATENCY_SETTING,
            "table": TABLE,
        },
        "dialects": {},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    for name in args.dialects.split(","):
        out["dialects"][name] = run_dialect(name, urls[name], args)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    with open(results / "own_dialects.json", "w") as f:
        json.dump(out, f, indent=1)
    (results / "own_dialects.md").write_text(render(out))
    driver.log(f"wrote {results}/own_dialects.md and {results}/own_dialects.json")
    return 1 if any(d["errors"] for d in out["dialects"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
