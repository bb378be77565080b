"""Python calls per task of a sqla-queue checkout's worker, by function.

    git worktree add --detach /tmp/wt_old 68c2bfe
    .venv/bin/python benchmarks/calls_per_task.py /tmp/wt_old /tmp/old.json
    .venv/bin/python benchmarks/calls_per_task.py . /tmp/new.json
    .venv/bin/python benchmarks/calls_per_task.py --compare /tmp/old.json /tmp/new.json

Wall time and CPU time per task swing by 10-40% between runs on these
machines; the number of Python calls a worker makes per task does not. Each
run loads 2,000 and then 6,000 pending no-op tasks (``ab_processing``'s
table), runs a burst worker on them in this process with cProfile on in
every thread, and keeps the difference divided by 4,000: the calls per
task, start-up and the last empty claims cancelled out. ``--compare``
prints the totals and the functions whose count changed most. C code
called from Python (psycopg's row parsing, SQLAlchemy's compiled parts)
counts one call per entry, however much it does.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _calls(checkout: str, table: str, count: int) -> dict[str, int]:
    """Run in a child process (one checkout per process): calls by function."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", checkout, table, str(count)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout))


def _child(checkout: str, table: str, count: int) -> None:
    sys.path[:0] = [checkout, str(HERE)]
    from ab_processing import load_noop_tasks  # type: ignore[import-not-found]
    from sqlalchemy import create_engine
    from sqlalchemy.orm import DeclarativeBase

    import sqla_queue

    assert str(sqla_queue.__file__).startswith(checkout), sqla_queue.__file__

    class Base(DeclarativeBase):
        pass

    model = type("Task", (sqla_queue.QueueMixin, Base), {"__tablename__": table})

    class Noop(sqla_queue.WorkerBase):
        processes = frozenset({"noop"})

        def execute(self, payload: Any, task: Any, session: Any) -> None:
            return None

    Noop.model = model
    engine = create_engine(URL)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    load_noop_tasks(engine, table, count)
    engine.dispose()
    profiles: list[cProfile.Profile] = []
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()

    threading.Thread.run = profiled  # type: ignore[method-assign]
    main = cProfile.Profile()
    profiles.append(main)
    main.enable()
    Noop().run(URL, burst=True)
    main.disable()
    engine = create_engine(URL)
    Base.metadata.drop_all(engine)
    engine.dispose()
    counts: dict[str, int] = {}
    for profile in profiles:
        stats: Any = pstats.Stats(profile, stream=io.StringIO())
        for (path, _line, function), (_cc, calls, *_rest) in stats.stats.items():
            where = path.split("site-packages/")[-1].replace(checkout + "/", "")
            if where == "~" and "at 0x" in function:
                function = function.split(" at 0x")[0]  # a builtin's address differs per run
            key = f"{where}:{function}"
            counts[key] = counts.get(key, 0) + calls
    json.dump(counts, sys.stdout)


def _measure(checkout: str, output: str) -> None:
    checkout = str(Path(checkout).resolve())
    small = _calls(checkout, "calls_per_task", 2000)
    large = _calls(checkout, "calls_per_task", 6000)
    per_task = {
        key: (large.get(key, 0) - small.get(key, 0)) / 4000 for key in set(small) | set(large)
    }
    Path(output).write_text(json.dumps(per_task, indent=0, sort_keys=True))
    print(f"{sum(per_task.values()):.1f} Python calls per task -> {output}")


def _compare(before_path: str, after_path: str) -> None:
    before = json.loads(Path(before_path).read_text())
    after = json.loads(Path(after_path).read_text())
    print(f"calls per task: before {sum(before.values()):.1f}, after {sum(after.values()):.1f}")
    keys = sorted(set(before) | set(after), key=lambda k: -abs(after.get(k, 0) - before.get(k, 0)))
    print("| change | before | after | function |\n|---:|---:|---:|---|")
    for key in keys[:25]:
        b, a = before.get(key, 0.0), after.get(key, 0.0)
        if abs(a - b) >= 0.005:
            print(f"| {a - b:+.2f} | {b:.2f} | {a:.2f} | `{key}` |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        parser = argparse.ArgumentParser()
        parser.add_argument("paths", nargs=2, help="CHECKOUT OUTPUT, or with --compare: A B")
        parser.add_argument("--compare", action="store_true")
        args = parser.parse_args()
        if args.compare:
            _compare(*args.paths)
        else:
            _measure(*args.paths)
