"""Payload text: one JSON text per task, hashed the way nsj-queue-lib hashes it.

A payload is any JSON value, and what goes in comes back equal: ``task.payload``
and the ``TaskRecord.payload`` a handler receives decode the stored text. The
text is written once, at flush or in ``QueueClient``:

- ``None`` is NULL, with no hash.
- A ``str`` is a string value. The reference (nsj-queue-lib) stores a str as
  is, so plain text that does not parse as JSON is stored as is too: same
  bytes, same hash. A str that *would* parse as JSON (``"123"``, ``"null"``,
  ``'{"a": 1}'``) is stored as a JSON string literal instead, or it would come
  back as ``123``, ``None`` or a dict. ``""`` stays ``""``, without a hash.
- :class:`JsonText` is JSON text the caller serialised: stored as is.
- Anything else is ``json.dumps(value, ensure_ascii=True)``, with the
  reference's conversions of datetimes, enums, decimals, UUIDs and objects
  (its ``nsj_gcf_utils.json_util.convert_to_dumps``), so that a dict gives the
  reference's text byte for byte, and so its hash.

The hash is the SHA-256 hex digest of the UTF-8 text, stored as its 64 ASCII
bytes. ``docs/payload.md`` is the written spec, with test vectors produced by
running the reference.

Reading is strict JSON (RFC 8259: no ``NaN`` or ``Infinity``); text that does
not parse is returned as the text. A str is written by the same test, which
is what makes it round-trip.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import hashlib
import inspect
import json
import re
import sys
import uuid
from collections.abc import Iterable
from typing import Any

from .exceptions import PayloadError

__all__ = [
    "UNHASHED",
    "JsonText",
    "PendingHash",
    "decode_payload",
    "hash_payload",
    "serialize_payload",
]


# ------------------------------------------------------------ reading JSON
def _refuse_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (and other readers of the
    # column: PostgreSQL's jsonb, Spark) does not
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_JSON_WHITESPACE = " \t\n\r"
# Most plain text is told from JSON by its first character, or as a word or
# a number, without the parser raising an exception (a few microseconds per
# str payload, on every enqueue).
_JSON_STARTS = frozenset('{["-0123456789tfn')
_JSON_WORDS = {"true": True, "false": False, "null": None}
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def _parse(text: str) -> tuple[bool, Any]:
    """(True, value) when ``text`` is a JSON text, else (False, None)."""
    stripped = text.strip(_JSON_WHITESPACE)
    first = stripped[:1]
    if first not in _JSON_STARTS:
        return False, None
    if first in "tfn":
        return (True, _JSON_WORDS[stripped]) if stripped in _JSON_WORDS else (False, None)
    if first not in '{["' and not _JSON_NUMBER.fullmatch(stripped):
        return False, None
    try:
        return True, _DECODER.decode(text)
    except (ValueError, RecursionError):
        return False, None


def decode_payload(text: str | None) -> Any:
    """The JSON value in ``text``; text that is not JSON is returned as is."""
    if text is None:
        return None
    is_json, value = _parse(text)
    return value if is_json else text


# ----------------------------------------------------------- writing JSON
def _wall_clock(value: dt.datetime | dt.time) -> str:
    return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"


def _calendar_date(value: dt.date) -> str:
    # the reference's strftime('%04Y-...'): four digits even before year 1000
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def _relativedelta_class() -> type | None:
    # dateutil is not a dependency: an instance can only exist once its
    # module is imported, so look there instead of importing it
    module = sys.modules.get("dateutil.relativedelta")
    return getattr(module, "relativedelta", None) if module is not None else None


def _reference_duration(delta: Any) -> str:
    """The reference's ISO-8601-like text of a dateutil ``relativedelta``.

    Its bugs are kept on purpose, for the same text and hash: hours alone do
    not open the time part (``relativedelta(hours=2)`` gives ``PT0S``), and
    microseconds and the absolute fields (``year=``, ``weekday=``...) are
    dropped."""
    years, months, days = int(delta.years), int(delta.months), int(delta.days)
    hours, minutes, seconds = int(delta.hours), int(delta.minutes), int(delta.seconds)
    text = "P"
    text += f"{years}Y" if years else ""
    text += f"{months}M" if months else ""
    text += f"{days}D" if days else ""
    if seconds or minutes:
        text += "T"
        text += f"{hours}H" if hours else ""
        text += f"{minutes}M" if minutes else ""
        text += f"{seconds}S" if seconds else ""
    return "PT0S" if text == "P" else text


def _not_serialisable(value: object) -> TypeError:
    return TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _reference_form(value: object) -> object:
    """What the reference's ``convert_to_dumps`` makes of a value that is not
    JSON already; the encoder calls this for every such value, at any depth.

    Values json encodes natively (dict, list, tuple, str, int, float, bool,
    None and their subclasses, so str- and int-valued enums) never get here;
    for those the native text is the reference's text. The reference
    converts a dict's values, not its keys: neither does this."""
    if isinstance(value, dt.datetime):
        # wall-clock time as written: the UTC offset and microseconds are dropped
        return f"{_calendar_date(value)}T{_wall_clock(value)}"
    if isinstance(value, dt.date):
        return _calendar_date(value)
    if isinstance(value, dt.time):
        return _wall_clock(value)  # offset and microseconds dropped too
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, enum.Enum):
        member_value = value.value
        if isinstance(member_value, tuple):
            # a tuple value gives its first str, as in the reference
            return next((v for v in member_value if isinstance(v, str)), member_value)
        return member_value
    relativedelta = _relativedelta_class()
    if relativedelta is not None and isinstance(value, relativedelta):
        return _reference_duration(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise _not_serialisable(value)
    if isinstance(value, type) or inspect.isroutine(value) or inspect.ismodule(value):
        # the reference would store their attribute dict (often "{}"):
        # never what was meant
        raise _not_serialisable(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        # an object is the dict of its attributes, methods and callables left out
        return {
            name: attribute
            for name, attribute in attributes.items()
            if not callable(getattr(value, name, None))
        }
    raise _not_serialisable(value)  # set, frozenset, objects with __slots__...


# json.dumps(value, ensure_ascii=True), the reference's call: default
# separators (", " and ": "), no key sorting. NaN and Infinity are refused:
# the reference writes them, but the result is not JSON.
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, default=_reference_form)


class JsonText(str):
    """JSON text you serialised yourself, stored and hashed as is.

    nsj-queue-lib code passes ``payload=json.dumps(d)``; a plain ``str`` is a
    string value here, so wrap such text: ``payload=JsonText(json.dumps(d))``.
    It must be valid JSON, else :class:`PayloadError`. Read back, the payload
    is the decoded value (a dict for a dict's text), not the text."""

    __slots__ = ()

    def __new__(cls, text: str) -> JsonText:
        if not isinstance(text, str):
            raise PayloadError(f"JsonText takes a str, not {type(text).__name__}")
        try:
            _DECODER.decode(text)
        except (ValueError, RecursionError) as exc:
            raise PayloadError(f"JsonText is not valid JSON: {exc}") from exc
        return super().__new__(cls, text)

    def __repr__(self) -> str:
        return f"JsonText({str.__repr__(self)})"


def _str_text(value: str) -> str:
    text = str.__str__(value)  # a str subclass (a str enum) is its text
    if text:
        is_json, _ = _parse(text)
        if is_json:
            # as is, it would come back as the value it spells: quote it
            return _ENCODER.encode(text)
    return text


def _lone_surrogate(character: str) -> PayloadError:
    return PayloadError(
        f"payload: a lone surrogate (U+{ord(character):04X}) is not Unicode text, "
        "and the payload is stored as UTF-8 JSON text"
    )


def _utf8(text: str) -> str:
    """``text``, refused if it cannot be encoded as UTF-8 (a lone surrogate)."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise _lone_surrogate(text[exc.start]) from None
    return text


def _utf8_json(text: str) -> str:
    """JSON ``text``, refused if a string in it holds a lone surrogate: as a
    character, or escaped (``\\ud800``). JSON's ``\\u`` escapes of UTF-16
    code units let ASCII text spell one, which PostgreSQL's ``jsonb``
    refuses and no UTF-8 text can hold; a pair (a character past U+FFFF,
    ``\\ud834\\udd1e``) is fine. Only text with such an escape is decoded
    to tell the two apart."""
    _utf8(text)
    if "\\ud" in text or "\\uD" in text:
        try:
            json.dumps(_DECODER.decode(text), ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise _lone_surrogate(exc.object[exc.start]) from None
    return text


def serialize_payload(value: Any) -> str | None:
    """The stored text of a payload (see the module docstring)."""
    if value is None:
        return None
    if type(value) is int:  # what the JSON encoder writes for one, without building it
        return int.__repr__(value)
    if isinstance(value, str):
        if isinstance(value, JsonText):
            return _utf8_json(str.__str__(value))  # a plain str for the driver
        return _str_text(_utf8(value))
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"the task payload cannot be serialised to JSON: {exc}") from exc
    return _utf8_json(text)


def hash_payload(text: str | None) -> bytes | None:
    """The reference's payload hash: hex SHA-256 of the text, as bytes."""
    if not text:
        return None
    try:
        return hashlib.sha256(text.encode()).hexdigest().encode()
    except UnicodeEncodeError as exc:  # a raw payload_text: serialize_payload refuses it first
        raise _lone_surrogate(exc.object[exc.start]) from None


def hash_payload_texts(texts: Iterable[str | None]) -> list[str | None]:
    """The hash of each text as the str of its 64 hex digits (None for no
    text), without a function call per text."""
    sha256 = hashlib.sha256
    try:
        return [sha256(text.encode()).hexdigest() if text else None for text in texts]
    except UnicodeEncodeError as exc:  # a raw payload_text: serialize_payload refuses it first
        raise _lone_surrogate(exc.object[exc.start]) from None


def json_key(name: str) -> str:
    """An object key as the payload's JSON writes it (quoted, ASCII), for
    code that assembles the text of a dict itself (the Spark enqueue)."""
    return _ENCODER.encode(name)


# ------------------------------------------------------- before the flush
_NOTHING: Any = object()


class PendingHash:
    """What ``payload_hash`` holds on a model instance until its flush.

    The flush hook replaces it with the hash. Holding the payload assigned to
    ``task.payload`` in a mapped column is what lets ``session.merge()`` copy
    it (merge copies mapped attributes only), and a path that skips the hook
    (``session.bulk_save_objects()``) binds it, which ``PayloadHash`` refuses
    (``UnpreparedTaskError``), instead of storing the row unprepared."""

    __slots__ = ("payload",)

    def __init__(self, payload: Any = _NOTHING) -> None:
        self.payload = payload

    @property
    def has_payload(self) -> bool:
        """False on :data:`UNHASHED`: no payload assigned, hash the text."""
        return self.payload is not _NOTHING

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<payload hash: computed at flush>"


UNHASHED = PendingHash()
"""A new instance's ``payload_hash`` until its flush when no payload was
assigned: the hook hashes ``payload_text`` (unless a hash was given)."""
