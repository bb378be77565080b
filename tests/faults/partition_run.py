"""The partition scenario at the issue's scale, run by hand (not collected:
its name does not start with ``test_``)::

    PARTITION_LEASE=6 PARTITION_CUT=60 SQLA_QUEUE_REQUIRE_DATABASES=1 \\
        .venv/bin/python -m pytest -q -s -p no:cacheprovider --timeout 900 \\
        tests/faults/partition_run.py

The scenario of tests/faults/test_partition.py with the workers' lease
``PARTITION_LEASE`` (default 6 s; the dead-peer bound is twice it) and a
cut of ``PARTITION_CUT`` seconds (default 60), on PostgreSQL and MariaDB:
every task must be done by the other worker within ``PARTITION_DONE``
seconds of the cut (default 45), while the cut lasts.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from sqlalchemy.engine import make_url

from tests.faults import test_partition as scenario
from tests.faults.test_partition import Cut

cuts = scenario.cuts  # the fixture, here too

LEASE = float(os.environ.get("PARTITION_LEASE", "6"))
CUT = float(os.environ.get("PARTITION_CUT", "60"))
DONE = float(os.environ.get("PARTITION_DONE", "45"))


@pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)
def test_partition_at_scale(db_url: str, table_name: str, cuts: Callable[..., Cut]) -> None:
    url = make_url(db_url)
    port = url.port or (5432 if url.get_backend_name() == "postgresql" else 3306)
    took = scenario._partition(
        db_url,
        db_url,
        table_name,
        cuts(port),
        {},
        lease=LEASE,
        dead_peer="auto",
        done_within=DONE,
        cut_seconds=CUT,
    )
    name = url.get_backend_name()
    print(f"{name}: lease {LEASE:g} s, cut {CUT:g} s: every task done {took:.1f} s after the cut")
