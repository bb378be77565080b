"""sqla-queue's alembic integration: operations, autogenerate, templates.

``import sqla_queue.alembic`` (the shipped ``env.py`` and ``script.py.mako``
do it) registers the ``op.*_queue_*`` operations and the autogenerate
comparator; ``sqla-queue alembic init DIR`` makes a migration environment
from the templates. docs/migrations.md tells the whole story.
"""

from __future__ import annotations

from . import compare as compare
from .operations import (
    AlterQueueChannelOp,
    CreateQueueIndexOp,
    CreateQueueNotifyTriggerOp,
    DeleteQueueSettingsOp,
    DropQueueIndexOp,
    DropQueueNotifyTriggerOp,
    InsertQueueSettingsOp,
    RenameQueueTableOp,
)
from .templates import TEMPLATES, init, load_metadata, migration_url, templates_directory

__all__ = [
    "TEMPLATES",
    "AlterQueueChannelOp",
    "CreateQueueIndexOp",
    "CreateQueueNotifyTriggerOp",
    "DeleteQueueSettingsOp",
    "DropQueueIndexOp",
    "DropQueueNotifyTriggerOp",
    "InsertQueueSettingsOp",
    "RenameQueueTableOp",
    "init",
    "load_metadata",
    "migration_url",
    "templates_directory",
]
