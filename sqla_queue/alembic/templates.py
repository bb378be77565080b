"""The alembic templates and what their ``env.py`` calls.

The templates are the package ``sqla_queue.alembic_templates`` (one folder
each, listed in setup.py). Stock ``alembic init -t NAME`` looks for NAME in
alembic's own folder only, so, as Flask-Migrate does, ``sqla-queue alembic
init`` runs alembic's ``init`` with a ``Config`` whose template directory is
ours.
(``alembic init -t`` with the absolute path of one of our templates works
too: ``sqla-queue alembic init --help`` prints where they are.)
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import re
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import MetaData
from sqlalchemy.engine import URL

from ..common.exceptions import ConfigurationError
from ..config.settings import database_url, normalize_url

TEMPLATES = ("generic", "multidb")
_TARGET_METADATA = re.compile(r"^target_metadata =[ \t]*$", re.MULTILINE)


def templates_directory() -> Path:
    """The folder that holds the templates (one subfolder each)."""
    return Path(str(importlib.resources.files("sqla_queue.alembic_templates")))


class _TemplatesConfig(Config):
    def get_template_directory(self) -> str:
        return str(templates_directory())


def init(
    directory: str,
    template: str = "generic",
    *,
    config_file: str = "alembic.ini",
    metadata: str | None = None,
) -> None:
    """``alembic init`` with one of sqla-queue's templates; ``metadata``
    (``module:attribute``) fills the ``target_metadata`` option left empty
    in the new ``config_file``."""
    if template not in TEMPLATES:
        raise CommandError(f"no template {template!r}: use one of {', '.join(TEMPLATES)}")
    if metadata is not None:
        _split_spec(metadata)
    existed = os.path.exists(config_file)
    command.init(_TemplatesConfig(config_file), directory, template=template)
    if metadata is not None and not existed:
        path = Path(config_file)
        path.write_text(_TARGET_METADATA.sub(f"target_metadata = {metadata}", path.read_text()))


def _split_spec(spec: str) -> tuple[str, list[str]]:
    module, _, attributes = spec.strip().partition(":")
    if not module or not attributes:
        raise CommandError(
            f"target_metadata {spec!r}: give module:attribute, e.g. myapp.models:Base.metadata"
        )
    return module, attributes.split(".")


def load_metadata(spec: str | None, option: str = "target_metadata") -> MetaData:
    """The ``MetaData`` named by ``spec`` (``module:attribute``; a declarative
    base class stands for its metadata), for a template's ``env.py``."""
    if not spec:
        raise CommandError(
            f"set {option} in alembic.ini to your models' metadata, e.g. myapp.models:Base.metadata"
        )
    module_name, attributes = _split_spec(spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"{option} {spec!r}: cannot import {module_name!r}: {exc}") from None
    for attribute in attributes:
        if not hasattr(found, attribute):
            raise CommandError(f"{option} {spec!r}: no attribute {attribute!r}")
        found = getattr(found, attribute)
    found = getattr(found, "metadata", found)
    if not isinstance(found, MetaData):
        raise CommandError(f"{option} {spec!r} is not a MetaData or a declarative base")
    return found


def migration_url(
    x_url: str | None = None, ini_url: str | None = None, *, environment: bool = True
) -> URL:
    """The database a migration runs on: ``alembic -x url=...``, else
    ``SQLA_QUEUE_URL`` or the seed's ``DB_*`` variables (the workers'
    configuration; not with ``environment=False``: a multi-database
    environment has several), else ``sqlalchemy.url`` in alembic.ini."""
    try:
        url = normalize_url(x_url) if x_url else database_url() if environment else None
        if url is None and ini_url:
            url = normalize_url(ini_url)
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from None
    if url is None:
        raise CommandError(
            "no database: pass -x url=..., set SQLA_QUEUE_URL (or the DB_* variables), "
            "or set sqlalchemy.url in alembic.ini"
        )
    return url
