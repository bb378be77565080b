"""The modules' paths before the layer folders (docs/architecture.md), still
importable: ``import sqla_queue.types`` gives ``sqla_queue.common.types``, the
same module object, so that applications written against the old paths keep
working. New code uses the new paths."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

__all__ = ["MOVED", "install"]

#: old path -> new path
MOVED = {
    "sqla_queue.aio": "sqla_queue.client.aio",
    "sqla_queue.batching": "sqla_queue.batch.transaction",
    "sqla_queue.catalog": "sqla_queue.config.catalog",
    "sqla_queue.configuration_table": "sqla_queue.schema.configuration_table",
    "sqla_queue.control": "sqla_queue.client.control",
    "sqla_queue.dashboard": "sqla_queue.ops.dashboard",
    "sqla_queue.dashboard.app": "sqla_queue.ops.dashboard.app",
    "sqla_queue.dashboard.assets": "sqla_queue.ops.dashboard.assets",
    "sqla_queue.dashboard.auth": "sqla_queue.ops.dashboard.auth",
    "sqla_queue.db_gen": "sqla_queue.cli.db_gen",
    "sqla_queue.ddl": "sqla_queue.alembic.ddl",
    "sqla_queue.ddl_singlestore": "sqla_queue.common.ddl_singlestore",
    "sqla_queue.events": "sqla_queue.enqueue.events",
    "sqla_queue.exceptions": "sqla_queue.common.exceptions",
    "sqla_queue.fairness": "sqla_queue.policies.fairness",
    "sqla_queue.fanout": "sqla_queue.stages.fanout",
    "sqla_queue.flush_insert": "sqla_queue.enqueue.flush_insert",
    "sqla_queue.hooks": "sqla_queue.policies.hooks",
    "sqla_queue.identifiers": "sqla_queue.common.identifiers",
    "sqla_queue.inspect": "sqla_queue.ops.status",
    "sqla_queue.leases": "sqla_queue.policies.leases",
    "sqla_queue.limits": "sqla_queue.policies.limits",
    "sqla_queue.logs": "sqla_queue.common.logs",
    "sqla_queue.maintenance.timing": "sqla_queue.config.timing",
    "sqla_queue.manager": "sqla_queue.batch.manager",
    "sqla_queue.metrics": "sqla_queue.ops.metrics",
    "sqla_queue.mixins": "sqla_queue.schema.mixins",
    "sqla_queue.pause": "sqla_queue.client.pause",
    "sqla_queue.payload": "sqla_queue.common.payload",
    "sqla_queue.payload_keys": "sqla_queue.schema.payload_keys",
    "sqla_queue.pipeline": "sqla_queue.policies.pipeline",
    "sqla_queue.progress": "sqla_queue.common.progress",
    "sqla_queue.ranges": "sqla_queue.config.ranges",
    "sqla_queue.records": "sqla_queue.schema.records",
    "sqla_queue.redaction": "sqla_queue.common.redaction",
    "sqla_queue.requeue": "sqla_queue.client.requeue",
    "sqla_queue.resolution": "sqla_queue.config.resolution",
    "sqla_queue.retry": "sqla_queue.policies.retry",
    "sqla_queue.routing": "sqla_queue.enqueue.routing",
    "sqla_queue.rows": "sqla_queue.schema.rows",
    "sqla_queue.server.client": "sqla_queue.worker.server_client",
    "sqla_queue.server.protocol": "sqla_queue.common.server_protocol",
    "sqla_queue.settings": "sqla_queue.config.settings",
    "sqla_queue.spark.cli": "sqla_queue.cli.spark",
    "sqla_queue.stamps": "sqla_queue.common.stamps",
    "sqla_queue.status_summary": "sqla_queue.ops.status_counts",
    "sqla_queue.subscribers": "sqla_queue.schema.subscribers",
    "sqla_queue.tenants": "sqla_queue.client.tenants",
    "sqla_queue.timelimit": "sqla_queue.policies.timelimit",
    "sqla_queue.tracing": "sqla_queue.ops.tracing",
    "sqla_queue.types": "sqla_queue.common.types",
    "sqla_queue.unique": "sqla_queue.enqueue.unique",
    "sqla_queue.validation": "sqla_queue.schema.validation",
    "sqla_queue.webhook_guard": "sqla_queue.webhooks.guard",
    "sqla_queue.webhook_transport": "sqla_queue.webhooks.transport",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new path."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path already."""


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # before the path finder: a moved package's
        # submodules must load under their new names only
