"""The dialects ``sqla-queue ddl`` compiles a queue's DDL for: here, apart
from :mod:`sqla_queue.alembic.ddl`, so that the CLI names its ``--dialect``
choices without importing alembic (half a second of every ``sqla-queue``
process's start)."""

from __future__ import annotations

__all__ = ["DIALECTS"]

#: ``--dialect`` choices -> the SQLAlchemy dialect that compiles the DDL
DIALECTS = {
    "postgresql": "postgresql://",
    "mysql": "mysql://",
    "mariadb": "mariadb://",
    "singlestore": "singlestoredb://",
    "sqlite": "sqlite://",
}
