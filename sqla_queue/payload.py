"""Payload text: serialised once, hashed the way nsj-queue-lib hashes it.

The reference library stores a ``str`` payload as is and a ``dict`` as
``json.dumps(value, ensure_ascii=True)`` with the default separators; the
hash is the SHA-256 hex digest of that text, stored as its 64 ASCII bytes.
Doing the same makes ``list_equivalent_task`` find equivalent tasks written
by either library.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import uuid
from typing import Any

from .exceptions import PayloadError


def _encode_extra(value: object) -> object:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        # a naive datetime without microseconds gives the reference's text
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# the reference's json.dumps(value, ensure_ascii=True): default separators, no key sorting
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, default=_encode_extra)


def serialize_payload(value: Any) -> str | None:
    """JSON text for ``value``; a ``str`` is taken as already serialised."""
    if value is None or isinstance(value, str):
        return value
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"the task payload cannot be serialised to JSON: {exc}") from exc


def hash_payload(text: str | None) -> bytes | None:
    """The reference's payload hash: hex SHA-256 of the text, as bytes."""
    if not text:
        return None
    return hashlib.sha256(text.encode()).hexdigest().encode("ascii")


def decode_payload(text: str | None) -> Any:
    """The JSON value in ``text``; text that is not JSON is returned as is."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
