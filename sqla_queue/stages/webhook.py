"""Webhook delivery as a batch stage: the HTTP calls of a claimed batch.

The :class:`WebhookStage` is a :class:`~sqla_queue.policies.pipeline.BatchStage` of
the :class:`~sqla_queue.batch.manager.TaskManager`: for a claimed batch (claim
committed) it reads the subscriptions the copies name in a short
transaction of its own, makes the calls outside any transaction,
concurrently and bounded (``webhook_concurrency``), then the batch
transaction records each outcome through the usual guarded path:
``sucesso``, or a failure with its retry or dead-letter run. The task's
lease (renewed by the heartbeat) and per-task lock cover the calls. No
database transaction is open while a call is in flight (the seed's third
advantage of webhooks in a queue).

The subscription is read from the subscriber table at delivery time, not
from the copy: the URL, method and headers in force now, and the signing
secret, which never leaves that table. The ``webhook-id`` header is the copy
chain's first id, the same for every retry of one delivery: the receiver's
idempotency key. A delivery is at least once: a worker killed after the call
and before its commit leaves the copy for the rescue, which calls again with
the same ``webhook-id``.

The worker classes that use it are in :mod:`sqla_queue.worker.webhook`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.orm import Session

from ..adapters import Adapter
from ..common.exceptions import SqlaQueueError
from ..policies.pipeline import Handler
from ..schema.records import TaskRecord
from ..webhooks.delivery import (
    Delivery,
    DeliveryResult,
    WebhookClient,
    allowed_networks_from_env,
    block_private_networks_from_env,
    webhook_timeout_from_env,
)

__all__ = ["WebhookDeliveryFailed", "WebhookStage", "webhook_subscribers_of"]

logger = logging.getLogger("sqla_queue.webhooks.delivery")


class WebhookDeliveryFailed(SqlaQueueError):
    """A webhook delivery failed; the text is the delivery's message."""

    #: the message says it all: the frames of the batch would be noise
    log_traceback = False


def _publication_text(task: TaskRecord) -> str | None:
    """The publication's payload text inside a copy's payload, sent as is."""
    payload = task.payload
    if isinstance(payload, dict):
        publication = payload.get("publication")
        if isinstance(publication, str) or publication is None:
            return publication
    raise WebhookDeliveryFailed(
        f"task {task.id} is not a pub/sub copy (its payload has no 'publication' text)"
    )


class WebhookStage:
    """Delivers the webhook copies of a claimed batch before its transaction.

    One per runner; lanes call :meth:`prepare` from their own threads, each
    with a :class:`WebhookClient` (a pooled ``requests.Session``) of its own.
    ``subscriber_ids``: the ids delivered by HTTP (None: every subscription);
    ``adapter``: the queue's, which reads the subscriptions.
    """

    def __init__(
        self,
        subscriber_table: Table,
        subscriber_ids: Iterable[str] | None,
        *,
        adapter: Adapter,
        timeout: float | None = None,
        concurrency: int = 8,
        block_private_networks: bool | None = None,
        allowed_networks: Iterable[str] | None = None,
    ) -> None:
        self.table = subscriber_table
        self.adapter = adapter
        self.subscriber_ids = None if subscriber_ids is None else frozenset(subscriber_ids)
        self.timeout = webhook_timeout_from_env() if timeout is None else timeout
        self.block_private_networks = (
            block_private_networks_from_env()
            if block_private_networks is None
            else block_private_networks
        )
        self.allowed_networks = (
            allowed_networks_from_env() if allowed_networks is None else tuple(allowed_networks)
        )
        self.concurrency = concurrency
        self._local = threading.local()
        self._clients: list[WebhookClient] = []
        self._clients_lock = threading.Lock()
        #: task id -> outcome, between prepare() and the batch's end
        self._outcomes: dict[int, DeliveryResult] = {}
        columns = ["id", "url", "http_method", "headers", "ativo"]
        if "signing_secret" in subscriber_table.c:
            columns.append("signing_secret")
        self._columns = tuple(columns)
        # a client made now checks the settings (timeout, concurrency,
        # WEBHOOK_ALLOWED_NETWORKS) at start
        self._client()

    def delivers(self, task: TaskRecord) -> bool:
        """Whether ``task`` is a live copy this stage delivers."""
        if task.pub_sub or task.dead or task.subscriber_id is None:
            return False
        return self.subscriber_ids is None or task.subscriber_id in self.subscriber_ids

    def _client(self) -> WebhookClient:
        client: WebhookClient | None = getattr(self._local, "client", None)
        if client is None:
            client = WebhookClient(
                self.timeout,
                block_private_networks=self.block_private_networks,
                allowed_networks=self.allowed_networks,
                max_concurrency=self.concurrency,
            )
            self._local.client = client
            with self._clients_lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    # ------------------------------------------------------------ a batch
    def prepare(self, conn: Connection, tasks: Sequence[TaskRecord]) -> bool:
        """Deliver the batch's webhook copies; True when any call was made
        (the batch must then record every outcome, whatever happens next)."""
        copies = [task for task in tasks if self.delivers(task)]
        if not copies:
            return False
        wanted = sorted({task.subscriber_id for task in copies if task.subscriber_id})
        # a short read, committed before the first call goes out
        with conn.begin():
            rows = self.adapter.subscription_get_many(
                conn, table=self.table, ids=wanted, columns=self._columns
            )
        subscriptions = {row["id"]: row for row in rows}
        deliveries: list[Delivery] = []
        sent: list[TaskRecord] = []
        for task in copies:
            refused = self._refusal(task, subscriptions.get(task.subscriber_id))
            if refused is not None:
                self._outcomes[task.id] = DeliveryResult(False, None, refused)
                continue
            row = subscriptions[task.subscriber_id]
            try:
                body = _publication_text(task)
            except WebhookDeliveryFailed as exc:
                self._outcomes[task.id] = DeliveryResult(False, None, str(exc))
                continue
            deliveries.append(
                Delivery(
                    url=row["url"],
                    http_method=row["http_method"] or "POST",
                    body=body,
                    delivery_id=str(task.chain_id),
                    headers=row["headers"],
                    signing_secret=row.get("signing_secret") or None,
                )
            )
            sent.append(task)
        for task, result in zip(sent, self._client().deliver_many(deliveries), strict=True):
            self._outcomes[task.id] = result
        return bool(sent)

    @staticmethod
    def _refusal(task: TaskRecord, row: Any) -> str | None:
        """Why ``task`` cannot be delivered, or None. Each is a failure that
        retries: a later fix of the subscription row delivers it."""
        if row is None:
            return f"subscription {task.subscriber_id!r} no longer exists in the subscriber table"
        if not row["ativo"]:
            return f"subscription {task.subscriber_id!r} is inactive (ativo = false)"
        if not row["url"]:
            return f"subscription {task.subscriber_id!r} has no url"
        return None

    def wrap(self, handler: Handler) -> Handler:
        """``handler``, with this stage's copies answered by their outcome."""

        def answer(task: TaskRecord, session: Session) -> Any:
            outcome = self._outcomes.get(task.id)
            if outcome is None:
                return handler(task, session)
            if outcome.ok:
                return outcome.message
            raise WebhookDeliveryFailed(outcome.message)

        return answer

    def forget(self, ids: Iterable[int]) -> None:
        for task_id in ids:
            self._outcomes.pop(task_id, None)


def webhook_subscribers_of(worker_class: type) -> frozenset[str] | None:
    """The subscription ids a worker class delivers by HTTP: None for
    every one (``WorkerWebhook``), else its ``webhook_subscribers``
    (empty: it delivers none)."""
    if getattr(worker_class, "delivers_every_subscription", False):
        return None
    return frozenset(getattr(worker_class, "webhook_subscribers", None) or ())
