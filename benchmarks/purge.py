"""(f) The purge: rows per second, and the claim rate while it runs.

1. 1,000,000 finished rows, 90 days old (nine in ten single-attempt chains,
   one in ten a failed attempt and its successful retry), then
   ``VACUUM ANALYZE`` and ``CHECKPOINT``; the purge routine deletes them all
   (chunks of ``--limit`` rows, no round limit): rows per second.
2. The table filled again; one in-process burst worker processes 20,000
   fresh no-op tasks beside the old rows: tasks per second without a purge.
3. The same, while the purge of the old rows runs: in another process (as
   when another worker of the queue runs it), then, filled again, in a
   thread of the worker's own process (the worker that runs the purge
   shares its GIL with it): tasks per second during the purge, and the
   purge's own rate under load.

    .venv/bin/python benchmarks/purge.py [--url URL] [--rows 1000000] [--tasks 20000]

Writes benchmarks/results/purge.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

from sqlalchemy import create_engine, text

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks import growth
from benchmarks.growth import Base, Task
from benchmarks.render_docs import purge_table
from sqla_queue import normalize_url
from sqla_queue.adapters import adapter_for
from sqla_queue.config.timing import Every
from sqla_queue.maintenance import PurgeConfig, PurgeRoutine

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TABLE = growth.TABLE


class Noop(growth.Noop):
    maintenance = False  # the benchmark runs the purge itself


def _fill(engine: Any, rows: int) -> float:
    """``rows`` finished rows, 90 days old; seconds taken."""
    started = time.perf_counter()
    singles, pairs = rows * 9 // 10, rows // 20
    columns = (
        "processo, payload, payload_hash, status, prioridade, mensagem, data_hora, "
        "data_hora_inicial, tentativa, id_inicial, reenfileirado"
    )
    old = "clock_timestamp() - interval '90 days'"
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {TABLE} ({columns}) SELECT 'old', '{{\"n\": ' || g || '}}', "
                "convert_to(md5(g::text) || md5(g::text), 'UTF8'), 'sucesso', 50, "
                f"'Concluído com sucesso', {old}, {old}, 1, NULL, false "
                "FROM generate_series(1, :n) AS g"
            ),
            {"n": singles},
        )
        # failed first attempts, then their retries pointing at them
        conn.execute(
            text(
                f"INSERT INTO {TABLE} ({columns}) SELECT 'old', '{{\"n\": ' || g || '}}', "
                "convert_to(md5(g::text) || md5(g::text), 'UTF8'), 'falha', 50, "
                f"'ValueError: boom. Tarefa reenfileirada.', {old}, {old}, 1, NULL, true "
                "FROM generate_series(1, :n) AS g"
            ),
            {"n": pairs},
        )
        conn.execute(
            text(
                f"INSERT INTO {TABLE} ({columns}) SELECT 'old', NULL, payload_hash, 'sucesso', "
                f"50, 'Concluído com sucesso', {old}, {old}, 2, id, false "
                f"FROM {TABLE} WHERE status = 'falha'"
            )
        )
    growth._vacuum(engine)
    return time.perf_counter() - started


def _purge(engine: Any, limit: int) -> tuple[int, float]:
    table = Task.__table__
    adapter = adapter_for(engine.dialect, table, TABLE)
    routine = PurgeRoutine(
        engine, adapter, Every(3600), PurgeConfig(max_age_days=60, limit=limit, rounds=1_000_000)
    )
    result = routine.run_once()
    assert result.error is None, result.error
    return result.counts["rows"], result.seconds


def _processing(engine: Any, url: str, n: int, during: Any) -> float:
    with engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {TABLE} WHERE processo = 'run'"))
        conn.execute(
            text(
                f"INSERT INTO {TABLE} (processo, payload, status, prioridade) "
                "SELECT 'run', '{\"n\": ' || g || '}', 'pendente', 50 "
                "FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
    if during is not None:
        during.start()
    started = time.perf_counter()
    Noop().run(url, burst=True)
    return n / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--purge-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = normalize_url(args.url).render_as_string(hide_password=False)
    engine = create_engine(url)
    if args.purge_only:  # the other process of step 3
        rows, seconds = _purge(engine, args.limit)
        print(json.dumps({"rows": rows, "seconds": seconds}))
        return 0
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    result: dict[str, Any] = {
        "url": normalize_url(args.url).render_as_string(),
        "limit": args.limit,
    }
    try:
        result["fill_seconds"] = _fill(engine, args.rows)
        rows, seconds = _purge(engine, args.limit)
        result["purge_alone"] = {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}
        _fill(engine, args.rows)
        result["claim_without_purge"] = _processing(engine, url, args.tasks, None)
        result["claim_during_purge"], result["purge_under_claims"] = _beside(
            engine, url, args, in_process=False
        )
        _fill(engine, args.rows)
        result["claim_during_purge_same_process"], result["purge_same_process"] = _beside(
            engine, url, args, in_process=True
        )
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()
    result["ratio"] = result["claim_during_purge"] / result["claim_without_purge"]
    same = result["claim_during_purge_same_process"] / result["claim_without_purge"]
    result["ratio_same_process"] = same
    results = pathlib.Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "purge.json").write_text(json.dumps(result, indent=1))
    print(purge_table(result))
    return 0


class _Purger:
    """The purge beside the worker: a process of its own, or a thread."""

    def __init__(self, url: str, limit: int, engine: Any, in_process: bool) -> None:
        self.result: dict[str, Any] = {}
        self.in_process = in_process
        self.engine, self.limit = engine, limit
        self.args = [sys.executable, __file__, "--url", url, "--limit", str(limit), "--purge-only"]
        self.proc: Any = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.in_process:
            self.thread = threading.Thread(target=self._run)
            self.thread.start()
        else:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)

    def _run(self) -> None:
        self.result["rows"], self.result["seconds"] = _purge(self.engine, self.limit)

    def join(self) -> dict[str, Any]:
        if self.thread is not None:
            self.thread.join()
        else:
            out, _ = self.proc.communicate(timeout=3600)
            self.result.update(json.loads(out))
        self.result["rows_per_s"] = self.result["rows"] / self.result["seconds"]
        return self.result


def _beside(engine: Any, url: str, args: Any, *, in_process: bool) -> tuple[float, dict[str, Any]]:
    purger = _Purger(url, args.limit, engine, in_process)
    rate = _processing(engine, url, args.tasks, purger)
    return rate, purger.join()


if __name__ == "__main__":
    sys.exit(main())
