"""What the runner needs of a worker: the contract ``WorkerBase`` fulfils.

The runner and the parts it builds know a worker only through this
protocol, so that :mod:`sqla_queue.worker.base` can start a runner
(``WorkerBase.run()``) without the runner importing the base class back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sqlalchemy import Connection, Table
from sqlalchemy.orm import Session

from ..schema.records import TaskRecord

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..schema.mixins import QueueMixin

__all__ = ["Worker"]


class Worker(Protocol):
    """A worker as the runner drives it (see ``WorkerBase`` for each member)."""

    batch_size: ClassVar[int]
    batch_seconds: ClassVar[float]
    transaction_per_task: ClassVar[bool]
    nsj_locks: ClassVar[bool | None]
    no_retry: ClassVar[tuple[type[BaseException], ...]]
    purge_before_delete: ClassVar[Callable[[Connection, Table, Sequence[int]], None] | None]
    periodic: ClassVar[Sequence[Any]]
    blocking_warning_seconds: ClassVar[float]
    fair_by: ClassVar[str | None]
    key_concurrency_limit: ClassVar[int | None]
    key_rate_limit: ClassVar[float | None]

    @classmethod
    def queue_model(cls) -> type[QueueMixin]: ...

    @classmethod
    def check_configuration(cls) -> None: ...

    @classmethod
    def is_async(cls) -> bool:
        """Whether the handlers are coroutine functions (worker/aio.py)."""
        ...

    @classmethod
    def overrides(cls, method: str) -> bool:
        """Whether the class defines its own ``method`` (``time_limit_for``,
        ``lease_seconds_for``): the runner then asks it for every task."""
        ...

    @classmethod
    def unrouted_warning(cls, table_name: str) -> str | None: ...

    def dispatch(self, task: TaskRecord, session: Session) -> str | None: ...

    def use_defaults(self, *, lease_seconds: float, time_limit_seconds: float | None) -> None:
        """The effective lease and time limit, from the composition root."""
        ...

    def lease_seconds_for(self, task: TaskRecord) -> float: ...

    def time_limit_for(self, task: TaskRecord) -> float | None: ...

    def open_tenants(self, settings: Settings, concurrency: int = 1) -> Any: ...

    def close_tenants(self) -> None: ...

    async def aclose_tenants(self) -> None: ...
