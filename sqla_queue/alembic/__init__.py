"""sqla-queue's alembic integration: operations, autogenerate, templates.

``import sqla_queue.alembic`` (the shipped ``env.py`` and ``script.py.mako``
do it) registers the ``op.*_queue_*`` operations and the autogenerate
comparator; ``include_object`` and ``render_item``, passed to
``context.configure`` (the shipped ``env.py`` does), keep the mixin's
indexes out of alembic's own comparison and write portable server
defaults; ``sqla-queue alembic init DIR`` makes a migration environment
from the templates. docs/migrations.md tells the whole story.
"""

from __future__ import annotations

from . import compare as compare
from .compare import include_object
from .operations import (
    AlterQueueChannelOp,
    CreateQueueIndexOp,
    CreateQueueNotifyTriggerOp,
    CreateQueueUniqueIndexOp,
    DeleteQueueSettingsOp,
    DropQueueIndexOp,
    DropQueueNotifyTriggerOp,
    DropQueueUniqueIndexOp,
    InsertQueueSettingsOp,
    RenameQueueTableOp,
)
from .render import render_item
from .templates import TEMPLATES, init, load_metadata, migration_url, templates_directory

__all__ = [
    "TEMPLATES",
    "AlterQueueChannelOp",
    "CreateQueueIndexOp",
    "CreateQueueNotifyTriggerOp",
    "CreateQueueUniqueIndexOp",
    "DeleteQueueSettingsOp",
    "DropQueueIndexOp",
    "DropQueueNotifyTriggerOp",
    "DropQueueUniqueIndexOp",
    "InsertQueueSettingsOp",
    "RenameQueueTableOp",
    "include_object",
    "init",
    "load_metadata",
    "migration_url",
    "render_item",
    "templates_directory",
]
