"""Fan-out: a claimed publication becomes one task per matching subscription.

A collaborator of the :class:`~sqla_queue.batch.manager.TaskManager`: the manager
runs a publication (``pub_sub`` true, not ``dead``) through
:meth:`FanOut.publish` instead of the worker's handler, in the batch
transaction, inside the task's savepoint. The copies are inserted there, so
they commit with the publication's guarded ``sucesso`` or not at all: an
exception between two chunks rolls the earlier chunks back with the
savepoint (the publication fails and retries, with no copies), and a crash
leaves the publication ``processando`` with no copies, for the rescue.

Copies keep nsj-queue-lib's payload shape, so a mixed fleet keeps working::

    {"publication": "<the publication's payload text>",
     "subscription": {"id": ..., "tenant": ..., ..., "ativo": true,
                      "created_at": "2026-11-22T14:59:41"}}

serialised by :mod:`sqla_queue.common.payload` (ensure_ascii, default separators)
and hashed as every payload. The subscription never carries the signing
secret, nor its headers' values (``"headers": null``), nor its URL's path
and query (``"url": "https://hooks.slack.com/***"``): they may hold tokens
and keys, and a copy row lives in the queue table for as long as its
retention; the webhook delivery reads them from the subscriber table. This
module decides what the rows are; the adapter runs the SQL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.orm import Session

from ..adapters import Adapter
from ..common.exceptions import FanOutError
from ..common.payload import hash_payload, serialize_payload
from ..policies.pipeline import Handler
from ..schema.mixins import Status
from ..schema.records import TaskRecord
from ..schema.rows import NO_SUBSCRIBERS_MESSAGE, PUBLISHED_MESSAGE
from ..schema.subscribers import SUBSCRIBER_COLUMN_NAMES, SubscriptionRecord
from ..webhooks.guard import show_url

__all__ = ["CHUNK_ROWS", "NO_SUBSCRIBERS_MESSAGE", "PUBLISHED_MESSAGE", "FanOut"]

logger = logging.getLogger("sqla_queue.stages.fanout")

#: copies per INSERT (or COPY) statement
CHUNK_ROWS = 1000


def copy_payload(publication: TaskRecord, subscription: SubscriptionRecord) -> str | None:
    """The reference's copy payload text (see the module docstring)."""
    shown = subscription.as_dict()
    # no token in a queue row: header values may be tokens, and a URL's path
    # and query may be keys (Slack, Azure Functions); the delivery reads the
    # subscriber table
    shown["headers"] = None
    if shown.get("url"):
        shown["url"] = show_url(shown["url"])
    return serialize_payload({"publication": publication.payload_text, "subscription": shown})


class FanOut:
    """Replicates publications of one queue table to the subscriptions in
    ``subscriber_table`` (None: the worker has no ``subscriber_model``, and
    a publication it claims fails with a message that says so)."""

    #: called between two chunk statements with the number of copies
    #: inserted so far (a test hook: tests fail or block a fan-out there)
    between_chunks: Callable[[int], None] | None = None

    def __init__(
        self, adapter: Adapter, subscriber_table: Table | None, *, worker_name: str = "the worker"
    ) -> None:
        self.adapter = adapter
        self.subscriber_table = subscriber_table
        self.worker_name = worker_name

    # a BatchStage (pipeline.py) that needs no work outside the transaction
    def prepare(self, conn: Connection, tasks: Sequence[TaskRecord]) -> bool:
        return False

    def forget(self, ids: Iterable[int]) -> None:
        pass

    def close(self) -> None:
        pass

    def wrap(self, handler: Handler) -> Handler:
        """``handler``, with publications routed to :meth:`publish`."""

        def route(task: TaskRecord, session: Session) -> Any:
            if task.pub_sub and not task.dead:
                return self.publish(task, session.connection())
            return handler(task, session)

        return route

    def copy_rows(
        self, publication: TaskRecord, subscriptions: list[SubscriptionRecord]
    ) -> list[dict[str, Any]]:
        rows = []
        for subscription in subscriptions:
            text = copy_payload(publication, subscription)
            rows.append(
                {
                    "origem": publication.origin,
                    "destino": publication.destination,
                    "processo": publication.process,
                    "chave_externa": publication.external_key,
                    "tentativa": 1,
                    "status": Status.PENDING.value,
                    "payload": text,
                    "payload_hash": hash_payload(text),
                    "tenant": publication.tenant,
                    "grupo_empresarial": publication.company_group,
                    "pub_sub": False,
                    "publication_id": publication.id,
                    "subscriber_id": subscription.id,
                    "dead": False,
                    # the reference let the default (50) apply; ours keeps the
                    # publication's priority
                    "prioridade": publication.priority,
                    # a copy runs in the trace that enqueued its publication
                    "trace_context": publication.trace_context,
                    **publication.extra,
                }
            )
        return rows

    def publish(self, publication: TaskRecord, conn: Connection) -> str:
        """Insert one copy per matching subscription on ``conn`` (the
        publication's transaction); the publication's ``mensagem``."""
        if self.subscriber_table is None:
            raise FanOutError(
                f"publication {publication.id} (process {publication.process!r}) cannot be "
                f"fanned out: {self.worker_name} has no subscriber_model (subclass "
                "WorkerPubSubBase and set subscriber_model to a SubscriberMixin model)"
            )
        found = self.adapter.subscription_list(
            conn,
            table=self.subscriber_table,
            process=publication.process,
            tenant=publication.tenant,
            company_group=publication.company_group,
            # the seed's columns only: a table made by nsj-queue-lib has no
            # signing_secret, and a copy never needs it
            columns=tuple(SUBSCRIBER_COLUMN_NAMES.values()),
        )
        if not found:
            return NO_SUBSCRIBERS_MESSAGE
        subscriptions = [SubscriptionRecord.from_mapping(row) for row in found]
        rows = self.copy_rows(publication, subscriptions)
        inserted = 0
        for start in range(0, len(rows), CHUNK_ROWS):
            if start and self.between_chunks is not None:
                self.between_chunks(inserted)
            chunk = rows[start : start + CHUNK_ROWS]
            self.adapter.task_insert_many(conn, rows=chunk)
            inserted += len(chunk)
        logger.info(
            "publication %d (%s) fanned out to %d subscription(s)",
            publication.id,
            publication.process,
            inserted,
        )
        return PUBLISHED_MESSAGE
