"""The web dashboard (``sqla-queue dashboard``; the ``dashboard`` extra):
see :mod:`.app` and docs/operations.md."""

from __future__ import annotations

from .app import DashboardConfig, create_app

__all__ = ["DashboardConfig", "create_app"]
