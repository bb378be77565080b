"""The HTTP side of webhooks: delivery, the URL guard, the transport.

This package was the module ``webhooks.py``: its public names are here still."""

from .delivery import (
    DEFAULT_WEBHOOK_TIMEOUT,
    MAX_REDIRECTS,
    MAX_RESPONSE_BYTES,
    MESSAGE_LIMIT,
    METHODS,
    WEBHOOK_TIMEOUT,
    Delivery,
    DeliveryResult,
    WebhookClient,
    allowed_networks_from_env,
    block_private_networks_from_env,
    sign,
    webhook_timeout_from_env,
)

__all__ = [
    "DEFAULT_WEBHOOK_TIMEOUT",
    "MAX_REDIRECTS",
    "MAX_RESPONSE_BYTES",
    "MESSAGE_LIMIT",
    "METHODS",
    "WEBHOOK_TIMEOUT",
    "Delivery",
    "DeliveryResult",
    "WebhookClient",
    "allowed_networks_from_env",
    "block_private_networks_from_env",
    "sign",
    "webhook_timeout_from_env",
]
