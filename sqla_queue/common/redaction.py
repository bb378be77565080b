"""Keep secrets out of ``mensagem`` and out of the logs.

Error texts often quote a URL with a password or a header with a token. They
are stored in the queue table, readable by every dashboard, so credentials
are masked before anything is written or logged.

What is masked: URL passwords (also with ``@``, ``:`` or ``/`` in them),
``key=value`` / ``"key": value`` pairs whose key names a secret (passwords,
tokens, API keys, client secrets, cloud keys: ``aws_secret_access_key``,
Azure's ``AccountKey`` / ``SharedAccessKey``, GCP's ``private_key``),
signatures in query strings (``sig=``, ``X-Amz-Signature=``), Azure
``SharedAccessSignature`` values, AWS access key ids (``AKIA…``, ``ASIA…``),
PEM private keys, ``Authorization`` / ``X-…-Key`` / ``X-…-Token`` header
values, and cookie values (``Cookie:``, ``Set-Cookie:``; the cookie names
stay, they help to debug). Names, hosts and the rest of the text are kept.

And keep a terminal safe from what is stored: :func:`escape_controls`
writes the control characters of a text (a webhook response body in
``mensagem``, a processo, a worker id...) as visible escapes before a
person's terminal or a text log line gets it (``\\x1b``, ``\\u202e``).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.exc import DBAPIError

__all__ = [
    "MASK",
    "describe_error",
    "escape_controls",
    "escape_json_line",
    "fit_message",
    "redact",
    "redact_json",
]

MASK = "***"

# Characters that end an unquoted value in running text.
_STOP = r"\s'\"<>"

# scheme://user:password@host. The user part may hold an '@' (Azure's
# "user@server" logins); the password may hold ':', '/' and '@', so it runs
# (lazily) up to the first '@' after which the host part has no other '@'
# before the path: "p@ss@host/db" masks "p@ss". A "user:" that is a
# "host:port/" is no password ("http://host:8080/a?mail=x@y").
_URL_PASSWORD = re.compile(
    rf"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#{_STOP}]*:)"
    rf"(?!\d{{1,5}}(?:[/?#{_STOP}]|$))"
    rf"[^{_STOP}]*?@"
    rf"(?![^/?#{_STOP}]*@)"
)
# Key names whose value is a secret. "\w*?" lets a prefix through
# (DB_PASS, PGPASSWORD, aws_secret_access_key, X-Auth-Token).
_SECRET_KEYS = (
    r"password|passwd|pwd|pass|secret|token|access_token|refresh_token"
    r"|api[_-]?key|client_secret|secret_?access_?key|account_?key|shared_?access_?key"
    r"|subscription[_-]?key|private_?key|functions[_-]key"
)
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"
_KEY_VALUE = re.compile(
    rf"(?i)\b(\w*?(?:{_SECRET_KEYS})\b['\"]?\s*[=:]\s*)({_QUOTED}|[^\s,;&)}}\]]+)"
)
# Signatures in query strings and SAS tokens: "sig" alone is too common a
# word to mask after ':' in prose, so only "name=value".
_SIGNATURE = re.compile(
    r"(?i)(?<![\w-])((?:sig|signature|x-amz-signature|x-goog-signature|x-amz-credential"
    r"|x-goog-credential)=)[^&\s'\"<>;,#]+"
)
# Azure "SharedAccessSignature=sv=...&sig=...;" (a connection string) and
# "SharedAccessSignature sr=...&sig=..." (an Authorization value): the whole
# token up to ';' or the end of the value.
_SAS = re.compile(rf"(?i)\b(SharedAccessSignature(?:\s*=\s*|\s+))[^;{_STOP}]+")
_AWS_KEY_ID = re.compile(r"\b((?:AKIA|ASIA))[A-Z0-9]{16}\b")
_PEM = re.compile(
    r"-----BEGIN ([A-Z ]*PRIVATE KEY)-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL
)
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization['\"]?\s*[=:]\s*['\"]?)"
    r"(?:bearer\s+|basic\s+|token\s+|digest\s+)?[^\s'\",;}]+"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")
# X-Api-Key, X-Functions-Key, X-Auth-Token, X-Amz-Security-Token... as headers
# ("Name: value", or "'Name': 'value'" in a dict).
_X_HEADER = re.compile(
    r"(?i)\b(x-[a-z0-9-]*?(?:key|token|secret|signature)['\"]?\s*:\s*['\"]?)[^\s'\",;}]+"
)
# Cookie: a=1; b=2 -> every value; Set-Cookie: a=1; Path=/ -> the first one
# (the attributes after it are not secret).
_COOKIE = re.compile(
    r"(?i)(?<!set-)\b(cookie['\"]?\s*:\s*['\"]?)"
    r"([^=\s;,'\"]+=[^;\s'\"]*(?:;\s*[^=\s;,'\"]+(?:=[^;\s'\"]*)?)*)"
)
_COOKIE_VALUE = re.compile(r"=[^;\s'\"]*")
_SET_COOKIE = re.compile(
    r"(?i)\b(set-cookie['\"]?\s*:\s*['\"]?[^=\s;,'\"]+=)(?:\"[^\"]*\"|[^;\s'\"]*)"
)


def _mask_cookies(match: re.Match[str]) -> str:
    return match.group(1) + _COOKIE_VALUE.sub(f"={MASK}", match.group(2))


def redact(text: str) -> str:
    """``text`` with passwords, tokens, keys, cookies and authorization
    values masked."""
    text = _PEM.sub(rf"-----BEGIN \1-----{MASK}-----END \1-----", text)
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _SAS.sub(rf"\1{MASK}", text)
    text = _AUTH_HEADER.sub(rf"\1{MASK}", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = _X_HEADER.sub(rf"\1{MASK}", text)
    text = _SET_COOKIE.sub(rf"\1{MASK}", text)
    text = _COOKIE.sub(_mask_cookies, text)
    text = _SIGNATURE.sub(rf"\1{MASK}", text)
    text = _AWS_KEY_ID.sub(rf"\1{MASK}", text)
    return _KEY_VALUE.sub(rf"\1{MASK}", text)


# A JSON key that names a secret, as _KEY_VALUE reads one in text
_SECRET_KEY = re.compile(rf"(?i)\b\w*?(?:{_SECRET_KEYS}|authorization|cookie)$")


def redact_json(value: Any) -> Any:
    """A decoded JSON value (a task's payload) with its secrets masked: the
    value of every key that names one (``password``, ``api_key``,
    ``X-Auth-Token``, ``Authorization``, ``Cookie``: the keys :func:`redact`
    masks in text), whatever it holds, is :data:`MASK`, and every other
    string goes through :func:`redact`."""
    if isinstance(value, dict):
        return {
            key: MASK if _SECRET_KEY.search(str(key)) else redact_json(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact_json(item) for item in value]
    if isinstance(value, str):
        return redact(value)
    return value


def fit_message(text: str, limit: int, suffix: str = "") -> str:
    """Redacted ``text`` + ``suffix``, cut so the whole fits in ``limit``."""
    text = redact(text)
    room = limit - len(suffix)
    if len(text) > room:
        text = text[: max(0, room - 1)] + "…"
    return (text + suffix)[:limit]


def describe_error(exc: BaseException) -> str:
    """``Type: text`` of an error, for ``mensagem``. A database error is
    described by the driver's error alone: SQLAlchemy's text adds the SQL and
    its parameters, which may hold anything."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = redact(str(exc)).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# What a terminal acts on or hides, as a character class: C0 (ESC starts
# the sequences that move the cursor, clear the screen, set the window's
# title, make hidden links), DEL, C1 (U+009B is a CSI of its own), and the
# invisible format characters (Unicode's Cf: the bidi overrides and
# isolates that reorder what is shown, zero-width spaces, the BOM, the tag
# characters that can carry hidden text), the line and paragraph
# separators, and lone surrogates (unprintable: a UnicodeEncodeError on
# stdout). ZWNJ and ZWJ (U+200C, U+200D) stay: scripts and emoji need them
# and they reorder nothing.
_CONTROLS = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\ud800-\udfff\ufeff"
    "\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)
_LINE_BREAKS = re.compile(r"\r\n|\n")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_controls(text: str, *, multiline: bool = False) -> str:
    """``text`` for a terminal or a text log line: every control or
    invisible format character (see ``_CONTROLS``) written as a visible
    Python-style escape, ``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\U000e0041``.
    Newlines too (one line stays one line: a table cell, a log line),
    unless ``multiline`` (a traceback), which keeps them (and turns
    ``\\r\\n`` into one). Everything else, backslashes included, is kept:
    the result is for a person to read, not to decode."""
    if not multiline:
        return _CONTROLS.sub(_visible, text)
    return "\n".join(_CONTROLS.sub(_visible, line) for line in _LINE_BREAKS.split(text))


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a character beyond the BMP as its surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escape_json_line(line: str) -> str:
    """A ``json.dumps(..., ensure_ascii=False)`` text with the characters
    :func:`escape_controls` escapes written as JSON escapes (``\\u009b``):
    the same JSON (a reader decodes the same values), safe in a terminal.
    (``json.dumps`` escapes C0 itself; it leaves DEL, C1 and the format
    characters as they are.)"""
    return _CONTROLS.sub(_json_escape, line)
