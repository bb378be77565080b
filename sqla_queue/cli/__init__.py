"""The ``sqla-queue`` command (click: small, well kept, already the de facto
standard for Python CLIs, and testable through its runner or a subprocess).

``main`` (the entry point, ``sqla_queue.cli:main``) is the group of
:mod:`.commands` (workers, schema, alembic, the queue server) with the
operations commands of :mod:`.operations` (maintenance, requeue, config), the
operator's of :mod:`.status` (status, cancel, retry-now, pause, resume, dashboard)
and Spark's group added; :mod:`.loading` turns ``module:Class`` into the
class.
"""

from __future__ import annotations

from .commands import main
from .loading import load_model, load_worker
from .operations import config, maintenance, requeue
from .spark import spark
from .status import cancel, dashboard, pause, resume, retry_now, status

__all__ = ["load_model", "load_worker", "main"]

main.add_command(maintenance)
main.add_command(requeue)
main.add_command(config)
main.add_command(spark)
main.add_command(status)
main.add_command(cancel)
main.add_command(retry_now)
main.add_command(dashboard)
main.add_command(pause)
main.add_command(resume)
