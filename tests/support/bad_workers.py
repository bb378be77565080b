"""Worker classes that must not start: each has one mistake.

``sqla-queue worker tests.support.bad_workers:NAME`` must stop with one line naming
the class and the attribute (tests/acceptance/test_configuration.py). They consume the
queue model of ``tests.support.app``; none of them ever reaches a database.
"""

from __future__ import annotations

import math
from typing import Any

from sqla_queue import WorkerBase
from tests.support.app import Task


class Good(WorkerBase):
    """No mistake: what the environment-variable tests run."""

    model = Task

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        return None


class Abstract(WorkerBase):  # execute is not implemented
    model = Task


class AsyncGeneratorExecute(WorkerBase):
    model = Task

    async def execute(self, payload: Any, task: Any, session: Any):  # type: ignore[no-untyped-def,override]
        yield None


class AsyncExecuteDead(Good):
    async def execute_dead(self, payload: Any, task: Any, session: Any) -> str | None:  # type: ignore[override]
        return None


class MaxRetryBool(Good):
    max_retry = True  # a bool is an int to Python, not an attempt count


class MaxRetryZero(Good):
    max_retry = 0


class MaxRetryText(Good):
    max_retry = "3"  # type: ignore[assignment]


class MaxRetryFloat(Good):
    max_retry = 2.0  # type: ignore[assignment]


class IntervalNaN(Good):
    retry_interval_minutes = math.nan


class IntervalNegative(Good):
    retry_interval_minutes = -1


class IntervalInfinite(Good):
    retry_interval_minutes = math.inf


class BatchSizeHuge(Good):
    batch_size = 10_001


class BatchSizeFloat(Good):
    batch_size = 2.5  # type: ignore[assignment]


class BatchSecondsZero(Good):
    batch_seconds = 0


class BatchSecondsInfinite(Good):
    batch_seconds = math.inf


class NoModel(WorkerBase):
    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        return None


class UnmappedModel(Good):
    model = dict  # type: ignore[assignment]


class TenantHandlerWithoutMultiDatabase(Good):  # run without MULTI_DATABASE=true
    def execute(  # type: ignore[override]
        self, payload: Any, task: Any, session: Any, tenant_session: Any
    ) -> str | None:
        return None


class ExecuteWithoutSession(Good):
    def execute(self, payload: Any, task: Any) -> str | None:  # type: ignore[override]
        return None
