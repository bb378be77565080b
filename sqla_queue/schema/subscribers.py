"""``SubscriberMixin``: the seed's subscriber table, and the record handlers get.

A pub/sub queue keeps its publications and their copies in the queue table
and its subscriptions in a table of its own::

    class Subscriber(SubscriberMixin, Base):
        __tablename__ = "fila_faturamento_subscriber"

Columns, types and defaults are nsj-queue-lib's (``id`` a string primary
key, ``tenant``, ``grupo_empresarial``, ``processo``, ``url``,
``http_method``, ``headers`` as JSON, ``ativo``, ``created_at``), with an
index on ``(tenant, grupo_empresarial, processo)``; the Python attributes
are English. One column is ours: ``signing_secret``, for webhook signatures.
It is **write-only** as far as sqla-queue is concerned: never logged, never
copied into a task's payload, never in :meth:`SubscriptionRecord.as_dict`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import JSON, BigInteger, Boolean, Index, String, Table, event, true
from sqlalchemy.orm import Mapped, Mapper, mapped_column

from ..common.identifiers import derived_identifier, validate_identifier
from ..common.types import UtcDateTime, utc_now
from .mixins import as_model_fields
from .records import SeedColumns

__all__ = ["SUBSCRIBER_COLUMN_NAMES", "SubscriberMixin", "SubscriptionRecord"]


class SubscriberMixin:
    """Columns of a pub/sub queue's subscriber table (one row per subscription)."""

    if TYPE_CHECKING:
        __table__: ClassVar[Table]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        as_model_fields(cls, SubscriberMixin)  # a SQLModel model's fields

    id: Mapped[str] = mapped_column("id", String(100), primary_key=True)
    tenant: Mapped[int | None] = mapped_column("tenant", BigInteger)
    company_group: Mapped[str | None] = mapped_column("grupo_empresarial", String(40))
    process: Mapped[str] = mapped_column("processo", String(250), nullable=False)
    url: Mapped[str | None] = mapped_column("url", String(2048))
    http_method: Mapped[str | None] = mapped_column("http_method", String(8))
    headers: Mapped[Any] = mapped_column("headers", JSON(none_as_null=True), nullable=True)
    active: Mapped[bool] = mapped_column(
        "ativo", Boolean, nullable=False, default=True, server_default=true()
    )
    created_at: Mapped[dt.datetime] = mapped_column(
        "created_at", UtcDateTime, nullable=False, server_default=utc_now()
    )
    # Ours: the secret that signs webhook deliveries. Write-only: sqla-queue
    # never logs it, never copies it into a task, never shows it in a record.
    signing_secret: Mapped[str | None] = mapped_column("signing_secret", String(200))

    def __repr__(self) -> str:  # no secret, no headers (they may hold tokens)
        return f"<{type(self).__name__} id={self.id!r} process={self.process!r}>"


#: English attribute -> seed column name (the reference's subscription dict keys)
SUBSCRIBER_COLUMN_NAMES: dict[str, str] = {
    "id": "id",
    "tenant": "tenant",
    "company_group": "grupo_empresarial",
    "process": "processo",
    "url": "url",
    "http_method": "http_method",
    "headers": "headers",
    "active": "ativo",
    "created_at": "created_at",
}
_ATTRIBUTES = {column: attribute for attribute, column in SUBSCRIBER_COLUMN_NAMES.items()}


@event.listens_for(SubscriberMixin, "after_mapper_constructed", propagate=True)
def _configure_subscriber_table(mapper: Mapper[Any], cls: type[SubscriberMixin]) -> None:
    table = mapper.local_table
    if not isinstance(table, Table) or mapper.inherits is not None:
        return
    if table.info.get("sqla_queue_subscribers"):
        return
    validate_identifier(table.name, "table name")
    if table.schema is not None:
        validate_identifier(table.schema, "schema name")
    table.info["sqla_queue_subscribers"] = True
    c = table.c
    # the reference's index: the fan-out looks subscriptions up by these
    Index(
        derived_identifier(table.name, "tenant_grupo_empresarial_processo", "ix_"),
        c.tenant,
        c.grupo_empresarial,
        c.processo,
    )


def _aware(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value
    parsed = dt.datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True, slots=True)
class SubscriptionRecord(SeedColumns):
    """One subscription, read-only, as a pub/sub handler gets it.

    Attributes are the English names; ``record["ativo"]`` reads by seed
    column name, as nsj-queue-lib's ``subscription`` dict did. There is no
    signing secret here: it never leaves the subscriber table."""

    id: str
    tenant: int | None = None
    company_group: str | None = None
    process: str | None = None
    url: str | None = None
    http_method: str | None = None
    headers: Any = None
    active: bool = True
    created_at: dt.datetime | None = field(default=None)

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> SubscriptionRecord:
        """From a row or dict keyed by seed column names (extra keys ignored,
        so a table row with ``signing_secret`` gives a record without it)."""
        values: dict[str, Any] = {
            attr: row.get(column) for column, attr in _ATTRIBUTES.items() if column in row
        }
        if "id" not in values or values["id"] is None:
            raise ValueError("a subscription needs an id")
        values["active"] = bool(values.get("active", True))
        values["created_at"] = _aware(values.get("created_at"))
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The reference's subscription dict: seed column names to values,
        in the reference table's column order, without the signing secret."""
        return {column: self[column] for column in _ATTRIBUTES}


SubscriptionRecord.seed_attributes = _ATTRIBUTES
