"""Workers: the handler base class and the runner that drives it."""

from __future__ import annotations

from .base import WorkerBase
from .runner import Runner

__all__ = ["Runner", "WorkerBase"]
