"""``WorkerPubSubBase``: one method per subscription of a pub/sub queue.

::

    class Indexar(WorkerPubSubBase):
        model = Task
        subscriber_model = Subscriber

        @subscriber("indice")
        def indexar(self, payload, subscription, task, session):
            session.add(IndexEntry(...))    # commits with this copy's 'sucesso'

        @dead_subscriber("indice")
        def indexar_morto(self, payload, subscription, task, session):
            ...

A worker of this class claims the publications of its table (of its
``processes``, when set) and fans each out to the matching subscriptions
(``sqla_queue/stages/fanout.py``), and claims the copies of *its* subscriptions
only: those whose ``subscriber_id`` has a method here. ``payload`` is the
decoded publication payload; ``subscription`` a :class:`SubscriptionRecord`
of the subscription as it was when the publication was fanned out (read from
the copy's payload, as nsj-queue-lib does: no query per task, and the same
view a mixed fleet gets; it has no signing secret).

Registries are built per class when the class is created, from its own and
its bases' decorated methods: two worker classes never share one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from sqlalchemy.orm import Session

from ..common.exceptions import ConfigurationError, SubscriberNotRegistered
from ..common.payload import decode_payload
from ..schema.records import TaskRecord
from ..schema.subscribers import SubscriberMixin, SubscriptionRecord
from .base import WorkerBase

__all__ = ["WorkerPubSubBase", "dead_subscriber", "subscriber"]

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__sqla_queue_subscriptions__"
_LIVE, _DEAD = "subscriber", "dead_subscriber"


def _marker(kind: str, subscriber_id: str) -> Callable[[F], F]:
    if not isinstance(subscriber_id, str) or not subscriber_id or len(subscriber_id) > 100:
        raise ConfigurationError(
            f"@{kind} takes a subscriber id (a non-empty string of at most 100 "
            f"characters), not {subscriber_id!r}"
        )

    def mark(function: F) -> F:
        marks = list(getattr(function, _MARK, ()))
        marks.append((kind, subscriber_id))
        setattr(function, _MARK, tuple(marks))
        return function

    return mark


def subscriber(subscriber_id: str) -> Callable[[F], F]:
    """Mark a method ``(self, payload, subscription, task, session)`` as the
    handler of the copies for subscription ``subscriber_id``."""
    return _marker(_LIVE, subscriber_id)


def dead_subscriber(subscriber_id: str) -> Callable[[F], F]:
    """Mark a method as the dead-letter handler of ``subscriber_id``'s copies."""
    return _marker(_DEAD, subscriber_id)


class WorkerPubSubBase(WorkerBase):
    """A pub/sub queue's worker: set ``model`` and ``subscriber_model``, and
    decorate methods with :func:`subscriber` / :func:`dead_subscriber`."""

    #: the SubscriberMixin model whose table lists the subscriptions
    subscriber_model: ClassVar[type[SubscriberMixin]]
    #: subscriber id -> method name, built for each class at its creation
    subscriber_methods: ClassVar[Mapping[str, str]] = MappingProxyType({})
    dead_subscriber_methods: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: subscription ids whose copies are delivered by HTTP to the
    #: subscription's url (the seed's ``SubscriberWebhook``; worker/webhook.py)
    webhook_subscribers: ClassVar[frozenset[str] | set[str]] = frozenset()
    #: most webhook calls of one batch in flight at once
    webhook_concurrency: ClassVar[int] = 8

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        registries: dict[str, dict[str, str]] = {_LIVE: {}, _DEAD: {}}
        # bases first, so a subclass's method for an id replaces its base's
        for klass in reversed(cls.__mro__):
            own: dict[tuple[str, str], str] = {}
            for name, value in vars(klass).items():
                function = (
                    value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                )
                for kind, subscriber_id in getattr(function, _MARK, ()):
                    if (kind, subscriber_id) in own:
                        raise ConfigurationError(
                            f"{klass.__name__}: @{kind}({subscriber_id!r}) is on both "
                            f"{own[(kind, subscriber_id)]} and {name}"
                        )
                    own[(kind, subscriber_id)] = name
            for (kind, subscriber_id), name in own.items():
                registries[kind][subscriber_id] = name
        cls.subscriber_methods = MappingProxyType(registries[_LIVE])
        cls.dead_subscriber_methods = MappingProxyType(registries[_DEAD])

    @classmethod
    def routed_subscriber_ids(cls) -> frozenset[str]:
        """The subscriber ids whose copies this class claims (routing.py)."""
        return (
            frozenset(cls.subscriber_methods)
            | frozenset(cls.dead_subscriber_methods)
            | frozenset(cls.webhook_subscribers or ())
        )

    # ----------------------------------------------------------- dispatch
    @staticmethod
    def _unpack(payload: Any, task: TaskRecord) -> tuple[Any, SubscriptionRecord]:
        """The decoded publication payload and the subscription of a copy."""
        if not isinstance(payload, dict) or "subscription" not in payload:
            raise SubscriberNotRegistered(
                f"task {task.id} is not a pub/sub copy (its payload has no 'subscription')"
            )
        publication = payload.get("publication")
        decoded = decode_payload(publication) if isinstance(publication, str) else publication
        return decoded, SubscriptionRecord.from_mapping(payload["subscription"])

    def execute(
        self, payload: Any, task: TaskRecord, session: Session, tenant_session: Any = None
    ) -> str | None:
        """Run the ``@subscriber`` method of the copy's subscription (with
        ``tenant_session`` after ``session`` in multi-database mode)."""
        cls = type(self)
        name = cls.subscriber_methods.get(task.subscriber_id or "")
        if name is None:
            raise SubscriberNotRegistered(
                f"no @subscriber({task.subscriber_id!r}) method in {cls.__module__}."
                f"{cls.__qualname__}: the copy fails and is retried"
            )
        return self._call(name, payload, task, session, tenant_session)

    def execute_dead(
        self, payload: Any, task: TaskRecord, session: Session, tenant_session: Any = None
    ) -> str | None:
        """Run the ``@dead_subscriber`` method, else the default dead handler."""
        name = type(self).dead_subscriber_methods.get(task.subscriber_id or "")
        if name is None:
            return super().execute_dead(payload, task, session, tenant_session)
        return self._call(name, payload, task, session, tenant_session)

    def _call(
        self, name: str, payload: Any, task: TaskRecord, session: Session, tenant_session: Any
    ) -> str | None:
        publication, subscription = self._unpack(payload, task)
        method = getattr(self, name)
        if tenant_session is None:
            result: str | None = method(publication, subscription, task, session)
        else:
            result = method(publication, subscription, task, session, tenant_session)
        return result

    # ----------------------------------------------------------- checks
    @classmethod
    def is_async(cls) -> bool:
        """Async when the subscriber methods are coroutine functions (the
        runner awaits what ``execute`` returns: the method's coroutine)."""
        return any(
            inspect.iscoroutinefunction(getattr(cls, name, None)) for name in cls._handler_methods()
        )

    @classmethod
    def _handler_methods(cls) -> list[str]:
        return sorted({*cls.subscriber_methods.values(), *cls.dead_subscriber_methods.values()})

    @classmethod
    def check_configuration(cls) -> None:
        for registry in (cls.subscriber_methods, cls.dead_subscriber_methods):
            for name in registry.values():
                if not callable(getattr(cls, name, None)):
                    raise ConfigurationError(f"{cls.__name__}.{name} is not a method")
        super().check_configuration()
        cls.subscriber_table_model()
        name = cls.__name__
        webhooks = cls.webhook_subscribers
        if not isinstance(webhooks, (set, frozenset)) or not all(
            isinstance(i, str) and 0 < len(i) <= 100 for i in webhooks
        ):
            raise ConfigurationError(
                f"{name}.webhook_subscribers must be a set of subscription ids (non-empty "
                f"strings of at most 100 characters), not {webhooks!r}"
            )
        both = sorted(frozenset(webhooks) & frozenset(cls.subscriber_methods))
        if both:
            raise ConfigurationError(
                f"{name}: subscription {both[0]!r} has a @subscriber method and is in "
                "webhook_subscribers: pick one"
            )
        if (
            isinstance(cls.webhook_concurrency, bool)
            or not isinstance(cls.webhook_concurrency, int)
            or not 1 <= cls.webhook_concurrency <= 256
        ):
            raise ConfigurationError(
                f"{name}.webhook_concurrency must be a whole number from 1 to 256, "
                f"not {cls.webhook_concurrency!r}"
            )

    @classmethod
    def _check_handlers(cls, *, tenant_session: bool) -> None:
        super()._check_handlers(tenant_session=tenant_session)
        for registry in (cls.subscriber_methods, cls.dead_subscriber_methods):
            for name in registry.values():
                cls._require_arguments(
                    name, "(self, payload, subscription, task, session)", tenant_session
                )

    @classmethod
    def subscriber_table_model(cls) -> type[SubscriberMixin]:
        model = getattr(cls, "subscriber_model", None)
        if not (
            isinstance(model, type)
            and issubclass(model, SubscriberMixin)
            and hasattr(model, "__table__")
        ):
            raise ConfigurationError(
                f"{cls.__name__}.subscriber_model must be a mapped SubscriberMixin model, "
                f"not {model!r}"
            )
        return model
