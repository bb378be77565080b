"""Keep secrets out of ``mensagem`` and out of the logs.

Error texts often quote a URL with a password or a header with a token. They
are stored in the queue table, readable by every dashboard, so credentials
are masked before anything is written or logged.
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+@")
_KEY_VALUE = re.compile(
    r"(?i)\b(\w*?(?:password|passwd|pwd|pass|secret|token|access_token"
    r"|refresh_token|api[_-]?key|client_secret)\b['\"]?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&)}\]]+)"
)
_AUTH_HEADER = re.compile(
    r"(?i)\b(authorization['\"]?\s*[=:]\s*['\"]?)(?:bearer\s+|basic\s+)?[^\s'\",;}]+"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")
MASK = "***"


def redact(text: str) -> str:
    """``text`` with passwords, tokens and authorization values masked."""
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _AUTH_HEADER.sub(rf"\1{MASK}", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    return _KEY_VALUE.sub(rf"\1{MASK}", text)


def fit_message(text: str, limit: int, suffix: str = "") -> str:
    """Redacted ``text`` + ``suffix``, cut so the whole fits in ``limit``."""
    text = redact(text)
    room = limit - len(suffix)
    if len(text) > room:
        text = text[: max(0, room - 1)] + "…"
    return (text + suffix)[:limit]
