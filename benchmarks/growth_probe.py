"""One round of growth.py's (e) measurement, with a schema change and the
index I/O counters: what the finished rows cost, and which index pays.

    python benchmarks/growth_probe.py [--url URL] [--finished 5000000] [SQL ...]

Each SQL argument runs after the table is created (for example
``'DROP INDEX ix_bench_growth_equivalente'``). Prints the empty-table rate,
the rate beside the finished rows, and per index the blocks read from
outside PostgreSQL's buffer cache and the buffer hits during the second
round (its preload and the worker's updates). Used for the analysis of (e)
in docs/benchmarks.md; server settings (shared_buffers, wal_compression)
were changed around it by hand with ALTER SYSTEM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import growth
from sqla_queue import normalize_url


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--finished", type=int, default=5_000_000)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("sql", nargs="*", help="statements to run after creating the table")
    args = parser.parse_args()
    url = normalize_url(args.url).render_as_string(hide_password=False)
    engine = create_engine(url)
    growth.Base.metadata.drop_all(engine)
    growth.Base.metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            for statement in args.sql:
                conn.execute(text(statement))
        empty = growth._processing_rate(engine, url, args.tasks)
        growth._preload(engine, args.finished, "sucesso", "noop")
        growth._vacuum(engine)
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_stat_reset()"))
        full = growth._processing_rate(engine, url, args.tasks)
        with engine.connect() as conn:
            io = conn.execute(
                text(
                    "SELECT indexrelname, idx_blks_read, idx_blks_hit "
                    "FROM pg_statio_user_indexes WHERE relname = :t ORDER BY indexrelname"
                ),
                {"t": growth.TABLE},
            ).all()
    finally:
        growth.Base.metadata.drop_all(engine)
        engine.dispose()
    print(f"empty {empty:,.0f}/s, {args.finished:,} finished rows {full:,.0f}/s")
    print(f"ratio {full / empty:.2f}")
    print("| index | blocks read | buffer hits |\n|---|---|---|")
    for name, read, hit in io:
        print(f"| {name} | {read:,} | {hit:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
