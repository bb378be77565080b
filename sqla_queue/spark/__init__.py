"""The data pipeline on Apache Spark (``pip install 'sqla-queue[spark]'``).

Three jobs, each a function here and a ``sqla-queue spark`` command, that
run the same on a laptop (``local[*]``) and on a cluster (its master URL):

- :func:`enqueue_dataframe`: one task per row of a DataFrame, written by the
  executors, a transaction per partition, with exactly the ORM path's
  payload text and hash (docs/spark-enqueue.md).
- :func:`queue_report`: a queue table's figures per process, tenant and day,
  read through Spark's JDBC source, as Parquet and as a Markdown report with
  plots (docs/spark-report.md).
- :func:`archive_chains` and :class:`ArchiveHook`: whole chains older than
  the retention appended to a Parquet dataset partitioned by day, counts
  verified, then deleted; the hook is the purge routine's ``before_delete``
  (docs/spark-archive.md).

:func:`spark_session` starts a session with what the jobs need (the JDBC
jars, the executors' Python, UTC). Importing this package does not import
PySpark: the names load on first use, so ``sqla-queue`` without the extra
still runs and says what to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analytics import ReportResult, queue_report
    from .archive import ArchiveHook, ArchiveResult, archive_chains
    from .enqueue import EnqueueResult, enqueue_dataframe
    from .session import spark_session

__all__ = [
    "ArchiveHook",
    "ArchiveResult",
    "EnqueueResult",
    "ReportResult",
    "archive_chains",
    "enqueue_dataframe",
    "queue_report",
    "spark_session",
]

_MODULES = {
    "ArchiveHook": "archive",
    "ArchiveResult": "archive",
    "archive_chains": "archive",
    "EnqueueResult": "enqueue",
    "enqueue_dataframe": "enqueue",
    "ReportResult": "analytics",
    "queue_report": "analytics",
    "spark_session": "session",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
