"""A worker class with a periodic task every second, on the table named by
``SQLA_QUEUE_TEST_TABLE`` (tests/support/app.py's model): the fleet test of
tests/integration/test_periodic.py runs several processes of it."""

from __future__ import annotations

from sqla_queue import Periodic
from tests.support.app import RecordingWorker


class TickWorker(RecordingWorker):
    periodic = (Periodic("tick", "@every 1s", process="faturar", payload={"n": "tick"}),)
