"""Webhook delivery in a worker: ``WorkerWebhook`` and the pub/sub handoff.

Two ways to deliver a subscription's copies by HTTP:

- ``sqla-queue webhook --model app:Task --subscriber-model app:Subscriber``
  runs :class:`WorkerWebhook`: no user code. It fans out publications and
  delivers the copies of every subscription (of its ``processes``, when set)
  to the subscription's ``url``.
- A :class:`~sqla_queue.worker.pubsub.WorkerPubSubBase` hands some
  subscription ids to the same delivery: ``webhook_subscribers = {"crm"}``,
  or the seed's class decorator ``@SubscriberWebhook("crm")``.

The delivery itself is a batch stage, :mod:`sqla_queue.stages.webhook`.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from sqlalchemy.orm import Session

from ..common.exceptions import ConfigurationError
from ..schema.records import TaskRecord
from ..stages.webhook import WebhookDeliveryFailed, WebhookStage, webhook_subscribers_of
from .pubsub import WorkerPubSubBase

__all__ = [
    "SubscriberWebhook",
    "WebhookDeliveryFailed",
    "WebhookStage",
    "WorkerWebhook",
    "webhook_subscribers_of",
]

W = TypeVar("W", bound=type)


class SubscriberWebhook:
    """The seed's class decorator: ``@SubscriberWebhook("crm")`` on a
    :class:`WorkerPubSubBase` subclass hands subscription ``crm``'s copies
    to the webhook delivery. Per class, like ``webhook_subscribers``."""

    def __init__(self, subscriber_id: str) -> None:
        if not isinstance(subscriber_id, str) or not subscriber_id or len(subscriber_id) > 100:
            raise ConfigurationError(
                "@SubscriberWebhook takes a subscriber id (a non-empty string of at most "
                f"100 characters), not {subscriber_id!r}"
            )
        self.subscriber_id = subscriber_id

    def __call__(self, cls: W) -> W:
        if not (isinstance(cls, type) and issubclass(cls, WorkerPubSubBase)):
            raise ConfigurationError(
                f"@SubscriberWebhook({self.subscriber_id!r}) decorates a WorkerPubSubBase "
                f"subclass, not {cls!r}"
            )
        own = frozenset(cls.__dict__.get("webhook_subscribers") or ())
        cls.webhook_subscribers = own | {self.subscriber_id}
        return cls


class WorkerWebhook(WorkerPubSubBase):
    """The built-in webhook worker: set ``model`` and ``subscriber_model``
    (the ``sqla-queue webhook`` command does it from its options). It fans
    out publications and delivers every subscription's copies by HTTP."""

    #: every subscription's copies go to the webhook delivery
    delivers_every_subscription: ClassVar[bool] = True
    #: a webhook worker needs no tenant database
    multi_database: ClassVar[bool | None] = False

    def execute(
        self, payload: Any, task: TaskRecord, session: Session, tenant_session: Any = None
    ) -> str | None:
        # every live copy is delivered by the WebhookStage before the batch
        # transaction; a copy that reaches here has no delivery outcome
        raise WebhookDeliveryFailed(
            f"task {task.id} is not a copy of a subscription (it has no subscriber_id)"
        )
