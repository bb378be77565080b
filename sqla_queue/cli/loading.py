"""``module:Class`` on the command line -> the worker class or the model."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ..common.exceptions import WorkerImportError
from ..worker import WorkerBase

__all__ = ["load_model", "load_worker"]


def _import(spec: str, what: str) -> Any:
    """``package.module:Name`` -> the object, or a one-line error about ``what``."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise WorkerImportError(f"give the {what} as module:Class, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkerImportError(f"cannot import {module_name!r}: {exc}") from exc
    found = getattr(module, name, None)
    if found is None:
        raise WorkerImportError(f"module {module_name!r} has no {name!r}")
    return found


def load_worker(spec: str) -> type[WorkerBase]:
    """``package.module:ClassName`` -> the WorkerBase subclass."""
    cls = _import(spec, "worker")
    if not (isinstance(cls, type) and issubclass(cls, WorkerBase)):
        raise WorkerImportError(f"{spec!r} is not a WorkerBase subclass")
    return cls


def load_model(spec: str, mixin: type, what: str) -> type:
    """``package.module:Model`` -> a mapped model class using ``mixin``."""
    cls = _import(spec, what)
    if not (isinstance(cls, type) and issubclass(cls, mixin) and hasattr(cls, "__table__")):
        raise WorkerImportError(f"{spec!r} is not a mapped {mixin.__name__} model")
    return cls
