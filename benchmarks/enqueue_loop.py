"""N transactional enqueues through a peer-harness adapter, nothing else.

    python benchmarks/enqueue_loop.py --adapter adapters.nsj_adapter --db bench_loop_nsj --n 1000

Run from the harness's directory with it (and, for sqla-queue's adapters,
benchmarks/peers) on PYTHONPATH, by benchmarks/enqueue_instructions.sh
under callgrind: the database is made afresh, the adapter set up, 50
enqueues run to warm up, then ``--n`` more (the harness's ``enqueue_one``,
one transaction each). The difference between a run of N and one of 0 is
what N enqueues cost the client.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import benchlib  # type: ignore[import-not-found]  # the peer harness (../shared/bench)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--n", type=int, required=True)
    args = parser.parse_args()
    adapter = importlib.import_module(args.adapter)
    benchlib.recreate_db(args.db)
    adapter.setup(benchlib.db_url(args.db))
    for seq in range(50 + args.n):
        adapter.enqueue_one(seq)
    adapter.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
