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
"""

from __future__ import annotations

import re

from sqlalchemy.exc import DBAPIError

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
