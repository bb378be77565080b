"""The payload contract (docs/payload.md): what goes in comes back equal, and
the stored text and hash of a dict are nsj-queue-lib's, byte for byte.

The vectors below were produced by running the reference's serialiser,
``nsj_gcf_utils.json_util.json_dumps`` (what nsj-queue-lib 1.2.2's
``insert_task`` calls for a dict), on the values of ``CASES``, in a venv of
its own; they are literals here so that no test needs the reference.
The unit tests need no database; the others run on SQLite, PostgreSQL and
MariaDB: through the ORM, ``QueueClient`` and a worker.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from sqla_queue import JsonText, PayloadError, QueueClient, TaskRecord, WorkerBase
from sqla_queue.common.payload import decode_payload, hash_payload, serialize_payload
from sqla_queue.config.settings import Settings
from tests.support.app import App

UTC = dt.timezone.utc
BRASILIA = dt.timezone(dt.timedelta(hours=-3))
INDIA = dt.timezone(dt.timedelta(hours=5, minutes=30))


class Color(str, enum.Enum):
    RED = "vermelho"


class Level(enum.IntEnum):
    HIGH = 3


class Kind(enum.Enum):
    TEXT = "texto"
    NUMBER = 7
    LABELLED = (2, "rotulado", "x")
    PAIR = (1, 2)
    RATIO = 1.5
    NOTHING = None


class Customer:
    def __init__(self) -> None:
        self.name = "Ana"
        self.since = dt.date(2020, 1, 31)
        self._internal = 1
        self.greet = lambda: "oi"  # a callable attribute: left out


class Invoice:
    def to_dict(self) -> dict[str, Any]:
        return {"number": 7, "issued": dt.datetime(2024, 1, 2, 3, 4, 5, 678)}


@dataclasses.dataclass
class Slot:
    start: dt.time
    size: decimal.Decimal


CASES: dict[str, Any] = {
    "datetime-microseconds": {"t": dt.datetime(2024, 5, 6, 7, 8, 9, 123456)},
    "datetime-utc": {"t": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)},
    "datetime-minus-3h": {"t": dt.datetime(2024, 5, 6, 21, 8, 9, 500, tzinfo=BRASILIA)},
    "datetime-plus-5h30": {"t": dt.datetime(2024, 12, 31, 23, 59, 59, 999999, tzinfo=INDIA)},
    "datetime-naive": {"t": dt.datetime(2024, 5, 6, 7, 8, 9)},
    "datetime-year-5": {"t": dt.datetime(5, 1, 2, 3, 4, 5)},
    "date": {"d": dt.date(2024, 2, 29)},
    "date-year-42": {"d": dt.date(42, 2, 3)},
    "time": {"h": dt.time(13, 14, 15)},
    "time-microseconds-utc": {"h": dt.time(13, 14, 15, 999999, tzinfo=UTC)},
    "enum-str": {"e": Color.RED},
    "enum-int": {"e": Level.HIGH},
    "enum-plain": {
        "a": Kind.TEXT,
        "b": Kind.NUMBER,
        "c": Kind.LABELLED,
        "d": Kind.PAIR,
        "e": Kind.RATIO,
        "f": Kind.NOTHING,
    },
    "decimal": {
        "v": decimal.Decimal("10.50"),
        "w": decimal.Decimal("1E+2"),
        "z": decimal.Decimal("-0.000"),
    },
    "uuid": {"u": uuid.UUID("12345678-1234-5678-1234-567812345678")},
    "nested-lists": {
        "l": [1, [dt.date(2024, 1, 1), {"x": decimal.Decimal("1.5")}], "s", [Kind.TEXT]]
    },
    "object": {"o": Customer()},
    "to-dict": {"o": Invoice()},
    "dataclass": {"o": Slot(dt.time(8, 30), decimal.Decimal("0.25"))},
    "keys": {1: "int", 2.5: "float", False: "bool", None: "none", Color.RED: "enum"},
    "non-ascii": {"cliente": "João", "neve": "☃", "clave": "𝄞"},
    "scalars": {"yes": True, "no": False, "none": None, "one": 1.0, "big": 1e100, "neg": -7},
    "empty": {},
    "deep": {"a": [{"b": {"c": [dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC), None]}}]},
}

# (case, the reference's text, sha256 hex of it), from running json_dumps
VECTORS = [
    (
        "datetime-microseconds",
        '{"t": "2024-05-06T07:08:09"}',
        "9f7277dc7a53b174e641fe771a359d3006118e3050b8cbaf41c20acfe594d54e",
    ),
    (
        "datetime-utc",
        '{"t": "2024-05-06T07:08:09"}',
        "9f7277dc7a53b174e641fe771a359d3006118e3050b8cbaf41c20acfe594d54e",
    ),
    (
        "datetime-minus-3h",
        '{"t": "2024-05-06T21:08:09"}',
        "f761ce98a7901aa01cd954562a495aadcfd6be1793e1a6f8c54e2b534d46b643",
    ),
    (
        "datetime-plus-5h30",
        '{"t": "2024-12-31T23:59:59"}',
        "c7fde1fa48d4dd114282975803a7d688d24ad0e56d3d653d947bcaeb95787129",
    ),
    (
        "datetime-naive",
        '{"t": "2024-05-06T07:08:09"}',
        "9f7277dc7a53b174e641fe771a359d3006118e3050b8cbaf41c20acfe594d54e",
    ),
    (
        "datetime-year-5",
        '{"t": "0005-01-02T03:04:05"}',
        "d501629339b830394fac20c9e24e32f45edc0ecb03e74ad357c6ee9286cb12f9",
    ),
    (
        "date",
        '{"d": "2024-02-29"}',
        "8a52e6d97ac6895166bcc100402a8b5c755c8fbaf944d3d882b389275b417bd4",
    ),
    (
        "date-year-42",
        '{"d": "0042-02-03"}',
        "22ac076c50a07705f058f24b44d08c85498598a2fa5936c877f74151eb4e4b69",
    ),
    (
        "time",
        '{"h": "13:14:15"}',
        "fabed139ad0596d51ea7fa12226c8f8098f6eacd0e6159969b1e8d4383b02783",
    ),
    (
        "time-microseconds-utc",
        '{"h": "13:14:15"}',
        "fabed139ad0596d51ea7fa12226c8f8098f6eacd0e6159969b1e8d4383b02783",
    ),
    (
        "enum-str",
        '{"e": "vermelho"}',
        "2d2c74faaff5a75deab0907f3cdbd358ab33f897196de2d09509faa07e4e7289",
    ),
    ("enum-int", '{"e": 3}', "ba7b5778d45e5bb37c1353df4a74d4ed83796630794091c9b48bd298d184f4b6"),
    (
        "enum-plain",
        '{"a": "texto", "b": 7, "c": "rotulado", "d": [1, 2], "e": 1.5, "f": null}',
        "ba272fd9886fdaa21f22655f8dfa31e2d7bffb6502a69d038afa8f9ed328267f",
    ),
    (
        "decimal",
        '{"v": "10.50", "w": "1E+2", "z": "-0.000"}',
        "c7b77979a49f38c2519ce6fa08b79971bcb24b1bc794c82a54aa118ff56ba57c",
    ),
    (
        "uuid",
        '{"u": "12345678-1234-5678-1234-567812345678"}',
        "bce3bde8f42df9df33cbdb4c25af0fab8d4fc5242c95437f4838d420e851e3a7",
    ),
    (
        "nested-lists",
        '{"l": [1, ["2024-01-01", {"x": "1.5"}], "s", ["texto"]]}',
        "92d7e619db1777b04d860e7beffc35186ac577b376560615c51397a62d01a1a1",
    ),
    (
        "object",
        '{"o": {"name": "Ana", "since": "2020-01-31", "_internal": 1}}',
        "44d0873f72ba18eb63cbdec2a3d249f40c3f6b37b5d9783316acb823f361e5db",
    ),
    (
        "to-dict",
        '{"o": {"number": 7, "issued": "2024-01-02T03:04:05"}}',
        "3c6b608f2287ec63db88dc3f98ab986809e6143f02b96d5b438b80b4a9659f37",
    ),
    (
        "dataclass",
        '{"o": {"start": "08:30:00", "size": "0.25"}}',
        "2690ea1950f80d4738d092649f6667db78578ce5231481012cb96e122463fab8",
    ),
    (
        "keys",
        '{"1": "int", "2.5": "float", "false": "bool", "null": "none", "vermelho": "enum"}',
        "26c0bf737145f759351659caf89821efc569a9af7039160c7ac8b97bda540b73",
    ),
    (
        "non-ascii",
        '{"cliente": "Jo\\u00e3o", "neve": "\\u2603", "clave": "\\ud834\\udd1e"}',
        "f33c1781929f4b9493bb595d00ec6c6749122e9fbcd6f2ba24221c145dcc50b2",
    ),
    (
        "scalars",
        '{"yes": true, "no": false, "none": null, "one": 1.0, "big": 1e+100, "neg": -7}',
        "a6b3f420f27b8a62aff8625f99de782412389d2b4cce83ab65fe7ad85063d477",
    ),
    ("empty", "{}", "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
    (
        "deep",
        '{"a": [{"b": {"c": ["2024-01-01T00:00:00", null]}}]}',
        "2ea628a0d4c4a76cdbed0698759efa6e1e0ee24b0e655e363344d5e46db2d4e9",
    ),
]
# dateutil's relativedelta (not a dependency of sqla-queue), same run
RELATIVEDELTA_VECTOR = (
    '{"full": "P1Y2M3DT4H5M6S", "hours-only": "PT0S", "zero": "PT0S", '
    '"negative-days": "P-1DT30S", "weeks-microseconds": "P14D", "hours-minutes": "PT4H5M"}',
    "e838dcdbe83216bbbad670f1af223694e112af05e2f034846b964e3913a178b0",
)

# Every kind of JSON value, with the str values that did not round-trip
ROUND_TRIP: list[Any] = [
    {"invoice": 7, "items": [1, 2.5, None, True], "nome": "João"},
    [1, "a", None, {"b": False}],
    "123",
    "null",
    "true",
    '"x"',
    '{"a": 1}',
    " [1] ",
    "-0.5e3",
    "texto livre",
    "conteúdo",
    "NaN",
    "",
    0,
    -5,
    2**70,
    1.5,
    1e100,
    True,
    False,
    None,
    [],
    {},
]


def _same(values: list[Any]) -> list[str]:
    # json.dumps tells 1 from 1.0 and True, and "1" from 1, where == does not
    return [json.dumps(value) for value in values]


# --------------------------------------------------- serialisation (unit)
@pytest.mark.parametrize(
    ("case", "reference_text", "reference_hash"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_dict_text_and_hash_are_the_references(
    case: str, reference_text: str, reference_hash: str
) -> None:
    stored = serialize_payload(CASES[case])
    assert (case, stored) == (case, reference_text)
    assert hash_payload(stored) == reference_hash.encode("ascii")
    assert hashlib.sha256(reference_text.encode()).hexdigest() == reference_hash


def test_relativedelta_text_is_the_references_with_its_bugs() -> None:
    relativedelta = pytest.importorskip("dateutil.relativedelta").relativedelta
    value = {
        "full": relativedelta(years=1, months=2, days=3, hours=4, minutes=5, seconds=6),
        "hours-only": relativedelta(hours=2),  # the reference ignores hours alone
        "zero": relativedelta(),
        "negative-days": relativedelta(days=-1, seconds=30),
        "weeks-microseconds": relativedelta(weeks=2, microseconds=5),
        "hours-minutes": relativedelta(hours=4, minutes=5),
    }
    stored = serialize_payload(value)
    assert (stored, hash_payload(stored)) == (
        RELATIVEDELTA_VECTOR[0],
        RELATIVEDELTA_VECTOR[1].encode(),
    )


def test_non_dict_values_are_json_where_the_reference_wrote_str() -> None:
    # the reference stored f"{payload}": the same text for numbers, Python's
    # repr for the rest; sqla-queue writes JSON (docs/payload.md)
    assert serialize_payload(123) == "123" == f"{123}"
    assert serialize_payload(1.5) == "1.5" == f"{1.5}"
    # the reference: "[1, 'a', None, True]" and "True"
    assert serialize_payload([1, "a", None, True]) == '[1, "a", null, true]'

    assert serialize_payload(True) == "true"
    assert serialize_payload((1, dt.date(2024, 1, 2))) == '[1, "2024-01-02"]'
    assert serialize_payload(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == '"2024-01-02T03:04:05"'
    assert serialize_payload(Kind.NUMBER) == "7"
    assert serialize_payload(Level.HIGH) == "3"


def test_a_tuple_in_a_dict_is_an_array() -> None:
    # the reference fails on it (a tuple has no __dict__); JSON has arrays
    assert serialize_payload({"t": (1, Kind.TEXT)}) == '{"t": [1, "texto"]}'


@pytest.mark.parametrize(
    ("value", "mentions"),
    [
        ({"b": b"raw"}, "bytes"),
        ({"s": {1}}, "set"),
        ({"f": frozenset()}, "frozenset"),
        ({"d": dt.timedelta(1)}, "timedelta"),
        ({"n": float("nan")}, "Out of range float"),
        ({"c": Customer}, "type"),
        ({"f": len}, "builtin_function_or_method"),
        ({"m": json}, "module"),
    ],
    ids=["bytes", "set", "frozenset", "timedelta", "nan", "class", "function", "module"],
)
def test_what_cannot_be_serialised_raises_a_one_line_payload_error(
    value: Any, mentions: str
) -> None:
    with pytest.raises(PayloadError) as info:
        serialize_payload(value)
    message = str(info.value)
    assert mentions in message
    assert "\n" not in message


# ------------------------------------------------------------ str (unit)
@pytest.mark.parametrize(
    "value",
    ["123", "null", "true", "false", '"x"', '{"a": 1}', "[]", " 7 ", "-0.5e3", "\t{}\n"],
)
def test_a_str_that_parses_as_json_is_stored_as_a_json_string(value: str) -> None:
    stored = serialize_payload(value)
    assert stored == json.dumps(value, ensure_ascii=True)
    assert decode_payload(stored) == value
    assert hash_payload(stored) == hashlib.sha256(stored.encode()).hexdigest().encode()


@pytest.mark.parametrize(
    "value",
    [
        "texto livre",
        "conteúdo",
        "nota 7",
        "7 notas",
        "truex",
        "nul",
        "{not json",
        "[1, 'a', None]",
        "01",
        "NaN",
        "-Infinity",
        "1.",
        " ",
        "☃ 𝄞",
    ],
)
def test_a_str_that_is_not_json_is_stored_as_is(value: str) -> None:
    assert serialize_payload(value) == value
    assert decode_payload(value) == value
    assert hash_payload(value) == hashlib.sha256(value.encode()).hexdigest().encode()


def test_the_empty_str_stays_empty_without_a_hash() -> None:
    assert serialize_payload("") == ""
    assert hash_payload(serialize_payload("")) is None
    assert decode_payload("") == ""


def test_a_str_enum_is_its_text() -> None:
    assert serialize_payload(Color.RED) == "vermelho"


def test_json_text_is_stored_as_is() -> None:
    built = json.dumps({"b": 2, "a": [1, "ç"]})
    stored = serialize_payload(JsonText(built))
    assert stored == built and type(stored) is str
    assert decode_payload(stored) == {"b": 2, "a": [1, "ç"]}
    assert isinstance(JsonText("1"), str)
    assert repr(JsonText("[1]")) == "JsonText('[1]')"


@pytest.mark.parametrize(
    "bad", ["", "texto", "{'a': 1}", '{"a": NaN}', "Infinity", "[1,]", "1 2"], ids=repr
)
def test_json_text_must_be_json(bad: str) -> None:
    with pytest.raises(PayloadError, match=r"^JsonText is not valid JSON: ") as info:
        JsonText(bad)
    assert "\n" not in str(info.value)


def test_json_text_takes_a_str() -> None:
    with pytest.raises(PayloadError, match="JsonText takes a str, not dict"):
        JsonText({"a": 1})  # type: ignore[arg-type]


def test_reading_is_strict_json() -> None:
    # the reference can write NaN in a dict; that text is not JSON
    assert decode_payload('{"n": NaN}') == '{"n": NaN}'
    assert decode_payload("[1, 'a', None]") == "[1, 'a', None]"
    assert decode_payload("True") == "True"
    assert decode_payload(' {"a": [1, 2.5]} ') == {"a": [1, 2.5]}


# --------------------------------------------------------- round trips
class _Collector(WorkerBase):
    received: list[tuple[int, Any, str | None]]

    def execute(self, payload: Any, task: TaskRecord, session: Session) -> str | None:
        self.received.append((task.id, payload, task.payload_text))
        return None


def _handled(app: App, engine: Engine) -> dict[int, Any]:
    """Run a burst worker; what its handler received, by task id."""
    received: list[tuple[int, Any, str | None]] = []
    worker = type("Collector", (_Collector,), {"model": app.Task, "received": received})
    assert worker().run(engine=engine, burst=True, settings=Settings()) == 0
    return {task_id: payload for task_id, payload, _ in received}


def _loaded(engine: Engine, app: App, ids: list[int]) -> list[Any]:
    with Session(engine) as s:
        by_id = {t.id: t.payload for t in s.scalars(select(app.Task))}
    return [by_id[i] for i in ids]


def test_every_json_value_round_trips_through_the_orm_and_a_worker(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        tasks = [app.Task(process="p", payload=value) for value in ROUND_TRIP]
        s.add_all(tasks)
        s.flush()
        ids = [t.id for t in tasks]
    assert _same(_loaded(engine, app, ids)) == _same(ROUND_TRIP)
    handled = _handled(app, engine)
    assert _same([handled[i] for i in ids]) == _same(ROUND_TRIP)


def test_every_json_value_round_trips_through_queue_client(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        one_by_one = [client.insert_task(process="p", payload=value) for value in ROUND_TRIP]
        many = client.insert_tasks([{"process": "p", "payload": value} for value in ROUND_TRIP])
    for ids in (one_by_one, many):
        assert _same(_loaded(engine, app, ids)) == _same(ROUND_TRIP)
    handled = _handled(app, engine)
    for ids in (one_by_one, many):
        assert _same([handled[i] for i in ids]) == _same(ROUND_TRIP)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_every_json_value_round_trips_through_copy_tasks(engine: Engine, app: App) -> None:
    with Session(engine) as s, s.begin():
        ids = QueueClient(s, app.Task).copy_tasks(
            [{"process": "p", "payload": value} for value in ROUND_TRIP]
        )
    assert _same(_loaded(engine, app, ids)) == _same(ROUND_TRIP)
    handled = _handled(app, engine)
    assert _same([handled[i] for i in ids]) == _same(ROUND_TRIP)


def test_stored_text_and_hash_are_the_references_on_every_database(
    engine: Engine, app: App, installed: None
) -> None:
    cases = ["datetime-microseconds", "datetime-minus-3h", "enum-plain", "non-ascii", "object"]
    with Session(engine) as s, s.begin():
        for case in cases:
            s.add(app.Task(process="orm", external_key=case, payload=CASES[case]))
        client = QueueClient(s, app.Task)
        for case in cases:
            client.insert_task(process="client", external_key=case, payload=CASES[case])
    expected = {case: (t, h.encode()) for case, t, h in VECTORS}
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT chave_externa, payload, payload_hash FROM {app.Task.__tablename__}")
        ).all()
    assert len(rows) == 2 * len(cases)
    for key, stored, digest in rows:
        assert (key, stored, bytes(digest)) == (key, *expected[key])


def test_equivalent_task_is_found_with_the_argument_insert_task_got(
    engine: Engine, app: App
) -> None:
    arguments: list[Any] = [
        "123",
        "null",
        "texto livre",
        '{"a": 1}',
        JsonText('{"a": 1}'),
        {"a": 1},
        [1, 2],
    ]
    with Session(engine) as s, s.begin():
        client = QueueClient(s, app.Task)
        ids = [
            client.insert_task("erp", "sefaz", "p", "k", payload=argument) for argument in arguments
        ]
    with Session(engine) as s:
        client = QueueClient(s, app.Task)
        found = [
            [r.id for r in client.list_equivalent_task("erp", "sefaz", "p", "k", argument)]
            for argument in arguments
        ]
    # the JsonText and the dict are the same text; every other argument its own
    assert found == [[ids[0]], [ids[1]], [ids[2]], [ids[3]], ids[4:6], ids[4:6], [ids[6]]]


def test_seed_rows_stay_readable(engine: Engine, app: App) -> None:
    # texts as nsj-queue-lib wrote them (a list as its repr, True as "True")
    seeds = ['{"a": 1}', "123", "texto", "[1, 'a']", "True", '{"n": NaN}', ""]
    with engine.begin() as conn:
        for seed in seeds:
            conn.execute(
                text(f"INSERT INTO {app.Task.__tablename__} (processo, payload) VALUES ('p', :p)"),
                {"p": seed},
            )
    expected = [{"a": 1}, 123, "texto", "[1, 'a']", "True", '{"n": NaN}', ""]
    with Session(engine) as s:
        assert [t.payload for t in s.scalars(select(app.Task).order_by(app.Task.id))] == expected
    handled = _handled(app, engine)
    assert [handled[i] for i in sorted(handled)] == expected


def test_assigned_payload_text_is_stored_as_is_and_hashed(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        task = app.Task(process="p", payload_text="texto cru")
        s.add(task)
    with Session(engine) as s, s.begin():
        task = s.scalars(select(app.Task)).one()
        assert (task.payload_text, task.payload_hash) == ("texto cru", hash_payload("texto cru"))
        task.payload_text = '{"cru": 1}'
    with Session(engine) as s:
        task = s.scalars(select(app.Task)).one()
        assert (task.payload_text, task.payload_hash, task.payload) == (
            '{"cru": 1}',
            hash_payload('{"cru": 1}'),
            {"cru": 1},
        )
