"""The wire protocol of the queue server: framed, versioned, bounded.

Every message, either way, is one frame::

    b"SQ" | version (1 byte) | body length (4 bytes, big-endian) | body

and the body is a JSON object, UTF-8, with a string ``op``. A frame whose
magic, version or length is wrong, or whose body is not such an object, is
a :class:`ProtocolError`: the server answers it with an ``error`` frame (as
far as the socket lets it) and closes that connection. Bodies are at most
:data:`MAX_BODY_BYTES`; nothing in the protocol comes near it.

The reference library ended messages with a text mark (``###END###``),
decoded each 1 KiB chunk alone, missed a mark split across two reads and
died of invalid UTF-8 (nsj-reference.md section 7); a length prefix has none
of these problems.

Authentication: on connect the server sends ``challenge`` with a random
nonce; the client answers ``auth`` with HMAC-SHA256(secret, nonce), so the
secret never crosses the network and a recorded answer is worth nothing on
the next connection. The server compares in constant time
(:func:`hmac.compare_digest`). Messages (``id`` is the client's, echoed)::

    server: {"op": "challenge", "nonce": HEX, "version": 1}
    client: {"op": "auth", "mac": HEX, "client": NAME}
    server: {"op": "ready", "queue": CHANNEL, "port": "notify"|"lock"}
    client: {"op": "lock"|"unlock", "id": N, "name": LOCK}
    client: {"op": "subscribe"|"notify", "id": N, "queue": CHANNEL}
    client: {"op": "ping", "id": N}
    server: {"op": "reply", "id": N, ...}  or  {"op": "error", "id": N, "error": TEXT}
    server: {"op": "wake", "queue": CHANNEL}   (pushed to subscribers)

An ``error`` frame instead of ``challenge`` or ``ready`` refuses the
connection; with ``"retry": true`` the server is only full (try again
later), else the client is refused (a wrong secret, a broken frame).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import struct
from collections.abc import Mapping
from typing import Any

from .exceptions import SqlaQueueError

__all__ = [
    "HEADER",
    "MAX_BODY_BYTES",
    "VERSION",
    "ProtocolError",
    "body_length",
    "decode_body",
    "encode",
    "lock_name",
    "mac",
]

MAGIC = b"SQ"
VERSION = 1
HEADER = struct.Struct("!2sBI")
MAX_BODY_BYTES = 16 * 1024
LOCK_NAME_MAX_LENGTH = 200
_LOCK_NAME = re.compile(r"[A-Za-z0-9_.:/-]+")
_AUTH_CONTEXT = b"sqla-queue-auth-v1:"


class ProtocolError(SqlaQueueError):
    """A frame broke the queue server's protocol."""


def encode(message: Mapping[str, Any]) -> bytes:
    """One frame holding ``message``."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode()
    if len(body) > MAX_BODY_BYTES:
        raise ProtocolError(f"a message of {len(body)} bytes is over {MAX_BODY_BYTES}")
    return HEADER.pack(MAGIC, VERSION, len(body)) + body


def body_length(header: bytes) -> int:
    """The body length a frame header announces, once the header is checked."""
    magic, version, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError("not a sqla-queue frame (bad magic)")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version} is not supported (only {VERSION} is)")
    if length > MAX_BODY_BYTES:
        raise ProtocolError(f"a frame of {length} bytes is over the limit of {MAX_BODY_BYTES}")
    return int(length)


def decode_body(body: bytes) -> dict[str, Any]:
    """The message in a frame's body: a JSON object with a string ``op``."""
    try:
        message = json.loads(body.decode("utf-8", errors="strict"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("a frame's body is not JSON in UTF-8") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError("a frame's body is not an object with an op")
    return message


def mac(secret: bytes, nonce: str) -> str:
    """The answer to a challenge: HMAC-SHA256 of the nonce, in hex."""
    return hmac.new(secret, _AUTH_CONTEXT + nonce.encode(), hashlib.sha256).hexdigest()


def lock_name(value: object) -> str:
    """``value`` if it is a valid lock name, else a ProtocolError."""
    if (
        not isinstance(value, str)
        or len(value) > LOCK_NAME_MAX_LENGTH
        or not _LOCK_NAME.fullmatch(value)
    ):
        raise ProtocolError(
            f"a lock name is 1 to {LOCK_NAME_MAX_LENGTH} letters, digits and _ . : / -"
        )
    return value
