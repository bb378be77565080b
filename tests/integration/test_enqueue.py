"""ORM enqueue: ``install(Session)`` + ``session.add(Task(...))``.

The flush hook completes each new queue row inside the caller's transaction:
the payload is serialised once and hashed the way nsj-queue-lib hashes it,
the status is ``agendada`` for a future ``run_at`` and ``pendente`` otherwise.
Every test here runs against real SQLite, PostgreSQL and MariaDB databases
unless it is about the hook's registration only (SQLite is enough there).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, insert, inspect, select, text, update
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

import sqla_queue.enqueue.events
from sqla_queue import (
    JsonText,
    NotInstalledError,
    PayloadError,
    QueueClient,
    QueueMixin,
    UnpreparedTaskError,
    install,
    uninstall,
)
from tests.support.app import App

UTC = dt.timezone.utc
# printf '{"a": 1}' | sha256sum
A_1_HASH = b"f9d86028c6e0d64e225186f96acb69338b2c59764df79162107f5c4bb34d1310"
# sha256("conteúdo"), as nsj-queue-lib stored it (nsj-reference.md §3, OBS)
CONTEUDO_HASH = b"0263637886787eeaa9529fecbc8e63beda6bad2ef5e61c349ff719aad84075b8"

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _count(engine: Engine, model: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


def _raw(engine: Engine, app: App, columns: str) -> list[tuple[Any, ...]]:
    """Columns of every queue row as the database stores them, by plain SQL."""
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(f"SELECT {columns} FROM {app.Task.__tablename__} ORDER BY id")
            )
        ]


def _tasks(engine: Engine, app: App) -> list[Any]:
    with Session(engine) as s:
        return list(s.scalars(select(app.Task).order_by(app.Task.id)))


@pytest.fixture
def not_installed() -> None:
    """The hook must not be on the Session class (another test leaked it)."""
    assert not event.contains(Session, "before_flush", sqla_queue.enqueue.events._before_flush), (
        "sqla_queue.install(Session) is still in effect from another test"
    )


# ---------------------------------------------------------- transactions
def test_commit_enqueues_the_task(engine: Engine, app: App, installed: None) -> None:
    with Session(engine) as s, s.begin():
        s.add(
            app.Task(
                process="faturar",
                payload={"invoice": 7},
                priority=80,
                external_key="7",
                origin="erp",
                destination="sefaz",
                tenant=47,
                company_group="G1",
            )
        )
    [task] = _tasks(engine, app)
    assert (
        task.process,
        task.payload,
        task.priority,
        task.status,
        task.attempt,
        task.external_key,
        task.origin,
        task.destination,
        task.tenant,
        task.company_group,
        task.pub_sub,
        task.dead,
    ) == ("faturar", {"invoice": 7}, 80, "pendente", 1, "7", "erp", "sefaz", 47, "G1", False, False)


def test_rollback_leaves_no_task(engine: Engine, app: App, installed: None) -> None:
    with Session(engine) as s:
        s.add(app.Effect(task_id=0, chain_id=0, note="business"))
        s.add(app.Task(process="faturar", payload={"invoice": 8}))
        s.flush()
        assert s.scalar(select(func.count()).select_from(app.Task)) == 1
        s.rollback()
    assert _count(engine, app.Task) == 0
    assert _count(engine, app.Effect) == 0


def test_task_commits_together_with_the_business_row(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Effect(task_id=0, chain_id=0, note="invoice 9"))
        s.add(app.Task(process="faturar", payload={"invoice": 9}))
    assert _count(engine, app.Effect) == 1
    assert [t.payload for t in _tasks(engine, app)] == [{"invoice": 9}]


# --------------------------------------------------------------- payload
def test_payload_is_serialised_and_hashed_on_flush(
    engine: Engine, app: App, installed: None
) -> None:
    payload = {"invoice": 7, "items": [1, 2]}
    with Session(engine) as s, s.begin():
        task = app.Task(process="faturar", payload=payload)
        s.add(task)
        # nothing serialised before the flush: payload_hash holds a placeholder
        assert task.payload_text is None
        assert not task.payload_hash
        assert task.payload == payload
        s.flush()
        assert task.payload_text == '{"invoice": 7, "items": [1, 2]}'
        assert task.payload_hash == hashlib.sha256(task.payload_text.encode()).hexdigest().encode()
        # changing the dict after the flush changes nothing stored
        payload["invoice"] = 8
    assert _raw(engine, app, "payload") == [('{"invoice": 7, "items": [1, 2]}',)]


def test_payload_is_serialised_once(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    real = sqla_queue.enqueue.events.serialize_payload

    def counting(value: Any) -> str | None:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(sqla_queue.enqueue.events, "serialize_payload", counting)
    with Session(engine) as s, s.begin():
        task = app.Task(process="faturar", payload={"invoice": 7})
        s.add(task)
        s.flush()
        task.priority = 90  # a second flush of the same row
        s.flush()
    assert calls == [{"invoice": 7}]
    assert _raw(engine, app, "payload, prioridade") == [('{"invoice": 7}', 90)]


def test_stored_payload_hash_is_the_references(engine: Engine, app: App, installed: None) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload={"a": 1}))
        s.add(app.Task(process="p", payload="conteúdo"))
    rows = _raw(engine, app, "payload, payload_hash, length(payload_hash)")
    assert [(text_, bytes(digest), length) for text_, digest, length in rows] == [
        (json.dumps({"a": 1}, ensure_ascii=True), A_1_HASH, 64),
        ("conteúdo", CONTEUDO_HASH, 64),
    ]


def test_non_ascii_dict_payload_is_stored_escaped(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload={"cliente": "João"}))
    [(stored, digest)] = _raw(engine, app, "payload, payload_hash")
    assert stored == '{"cliente": "Jo\\u00e3o"}'
    assert bytes(digest) == hashlib.sha256(stored.encode()).hexdigest().encode()
    assert [t.payload for t in _tasks(engine, app)] == [{"cliente": "João"}]


def test_str_payload_is_a_string_value(engine: Engine, app: App, installed: None) -> None:
    plain = "texto livre, não JSON"
    json_text = '{"b":2,  "a": 1}'
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload=plain))
        s.add(app.Task(process="p", payload=json_text))
        s.add(app.Task(process="p", payload=JsonText(json_text)))
    quoted = json.dumps(json_text)  # '"{\\"b\\":2,  \\"a\\": 1}"'
    rows = _raw(engine, app, "payload, payload_hash")
    assert [(stored, bytes(digest)) for stored, digest in rows] == [
        # plain text: as nsj-queue-lib stores it, byte for byte
        (plain, hashlib.sha256(plain.encode()).hexdigest().encode()),
        # a str that parses as JSON: a JSON string literal, so it comes back a str
        (quoted, hashlib.sha256(quoted.encode()).hexdigest().encode()),
        # JSON text the caller built: as is
        (json_text, hashlib.sha256(json_text.encode()).hexdigest().encode()),
    ]
    assert [t.payload for t in _tasks(engine, app)] == [plain, json_text, {"b": 2, "a": 1}]


def test_none_payload_stores_null_without_hash(engine: Engine, app: App, installed: None) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload=None))
        s.add(app.Task(process="q"))
    assert _raw(engine, app, "processo, payload, payload_hash") == [
        ("p", None, None),
        ("q", None, None),
    ]


def test_reassigned_payload_is_serialised_and_hashed_again(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload={"v": 1}))
    with Session(engine) as s, s.begin():
        task = s.scalars(select(app.Task)).one()
        task.payload = {"v": 2}
    rows = _raw(engine, app, "payload, payload_hash, status")
    assert [(p, bytes(h), st) for p, h, st in rows] == [
        ('{"v": 2}', hashlib.sha256(b'{"v": 2}').hexdigest().encode(), "pendente")
    ]


@pytest.mark.parametrize(
    ("payload", "mentions"),
    [
        ({"x": object()}, "object"),
        ({"tags": {"a", "b"}}, "set"),
        ({"amount": float("nan")}, "Out of range float"),
    ],
    ids=["object", "set", "nan"],
)
def test_unserialisable_payload_raises_and_leaves_no_row(
    engine: Engine, app: App, installed: None, payload: Any, mentions: str
) -> None:
    s = Session(engine)
    try:
        s.add(app.Effect(task_id=0, chain_id=0, note="business change"))
        s.flush()  # the business row is already written in the transaction
        s.add(app.Task(process="faturar", payload=payload))
        with pytest.raises(PayloadError) as info:
            s.commit()
    finally:
        s.close()
    assert "the task payload cannot be serialised to JSON" in str(info.value)
    assert mentions in str(info.value)
    assert _count(engine, app.Task) == 0
    assert _count(engine, app.Effect) == 0


def test_unserialisable_payload_in_a_begin_block_leaves_no_row(
    engine: Engine, app: App, installed: None
) -> None:
    with (
        pytest.raises(PayloadError, match="set is not JSON serializable"),
        Session(engine) as s,
        s.begin(),
    ):
        s.add(app.Effect(task_id=0, chain_id=0, note="business change"))
        s.add(app.Task(process="faturar", payload={1, 2}))
    assert _count(engine, app.Task) == 0
    assert _count(engine, app.Effect) == 0


@sqlite_only
def test_payload_error_is_raised_at_flush_not_at_assignment(
    engine: Engine, app: App, installed: None
) -> None:
    task = app.Task(process="p", payload=object())  # no error yet
    with Session(engine) as s:
        s.add(task)
        with pytest.raises(PayloadError):
            s.flush()
        s.rollback()
    assert _count(engine, app.Task) == 0


# ------------------------------------------------------ status and times
def test_future_run_at_is_scheduled(engine: Engine, app: App, installed: None) -> None:
    run_at = (dt.datetime.now(UTC) + dt.timedelta(hours=2)).replace(microsecond=123456)
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload={"k": 1}, run_at=run_at))
    [task] = _tasks(engine, app)
    assert task.status == "agendada"
    assert task.run_at == run_at
    assert task.first_run_at == run_at
    assert task.run_at.tzinfo is not None


def test_past_run_at_is_pending(engine: Engine, app: App, installed: None) -> None:
    run_at = dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload={"k": 1}, run_at=run_at))
    [task] = _tasks(engine, app)
    assert (task.status, task.run_at, task.first_run_at) == ("pendente", run_at, run_at)


def test_naive_run_at_means_utc(engine: Engine, app: App, installed: None) -> None:
    naive = (dt.datetime.now(UTC) + dt.timedelta(days=1)).replace(tzinfo=None, microsecond=0)
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", run_at=naive))
    [task] = _tasks(engine, app)
    assert task.status == "agendada"
    assert task.run_at == naive.replace(tzinfo=UTC)
    assert task.first_run_at == naive.replace(tzinfo=UTC)


def test_run_at_in_another_time_zone_keeps_its_instant(
    engine: Engine, app: App, installed: None
) -> None:
    brasilia = dt.timezone(dt.timedelta(hours=-3))
    run_at = dt.datetime(2020, 6, 1, 21, 30, tzinfo=brasilia)  # 2020-06-02 00:30 UTC
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", run_at=run_at))
    [task] = _tasks(engine, app)
    assert task.status == "pendente"
    assert task.run_at == dt.datetime(2020, 6, 2, 0, 30, tzinfo=UTC)
    assert task.run_at.utcoffset() == dt.timedelta(0)


def test_without_run_at_the_database_dates_a_pending_task(
    engine: Engine, app: App, installed: None
) -> None:
    before = dt.datetime.now(UTC)
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="p", payload={"k": 1}))
    after = dt.datetime.now(UTC)
    [task] = _tasks(engine, app)
    assert task.status == "pendente"
    # the database's clock, in UTC: same machine, so within minutes of ours
    margin = dt.timedelta(minutes=5)
    assert before - margin <= task.run_at <= after + margin
    assert before - margin <= task.first_run_at <= after + margin


def test_priority_defaults_to_50(engine: Engine, app: App, installed: None) -> None:
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="default", payload={"k": 1}))
        s.add(app.Task(process="given", payload={"k": 2}, priority=10))
    assert _raw(engine, app, "processo, prioridade, tentativa") == [
        ("default", 50, 1),
        ("given", 10, 1),
    ]


def test_server_defaults_load_on_access_after_flush(
    engine: Engine, app: App, installed: None
) -> None:
    # the INSERT returns only the id (eager_defaults=False); the rest loads on access
    with Session(engine) as s, s.begin():
        task = app.Task(process="p", payload={"k": 1})
        s.add(task)
        s.flush()
        assert "run_at" not in task.__dict__
        assert (task.attempt, task.priority, task.requeued, task.dead) == (1, 50, False, False)
        # two reads of the database clock (clock_timestamp() on PostgreSQL)
        assert task.run_at is not None and task.first_run_at is not None
        assert abs(task.run_at - task.first_run_at) < dt.timedelta(seconds=1)
        assert task.status == "pendente"


def test_eager_defaults_off_unless_the_model_asks(table_name: str) -> None:
    class Base(DeclarativeBase):
        pass

    class Plain(QueueMixin, Base):
        __tablename__ = table_name + "_p"

    class Eager(QueueMixin, Base):
        __tablename__ = table_name + "_e"
        __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012

    class Sub(Plain):  # single-table subclass: inherits nothing it did not ask for
        pass

    assert (inspect(Plain).eager_defaults, inspect(Eager).eager_defaults) == (False, True)
    assert inspect(Sub).polymorphic_identity is None and inspect(Sub).base_mapper is inspect(Plain)


def test_plain_sql_insert_gets_the_seed_defaults(engine: Engine, app: App) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {app.Task.__tablename__} (processo, payload) "
                "VALUES (:processo, :payload)"
            ),
            {"processo": "legado", "payload": '{"a": 1}'},
        )
    [task] = _tasks(engine, app)
    assert (
        task.process,
        task.payload_text,
        task.status,
        task.attempt,
        task.priority,
        task.pub_sub,
        task.dead,
        task.requeued,
        task.retries_exhausted,
        task.initial_id,
        task.payload_hash,
    ) == ("legado", '{"a": 1}', "pendente", 1, 50, False, False, False, False, None, None)
    assert isinstance(task.run_at, dt.datetime)
    assert isinstance(task.first_run_at, dt.datetime)
    now = dt.datetime.now(UTC)
    assert now - dt.timedelta(minutes=5) <= task.run_at <= now + dt.timedelta(minutes=5)


# ------------------------------------------------------- other ORM paths
# Every way into the table through the ORM either completes the row as the
# flush hook does, or is refused; none stores a task without its payload,
# its hash or its status.
def _future() -> dt.datetime:
    return (dt.datetime.now(UTC) + dt.timedelta(hours=2)).replace(microsecond=0)


def _digest(text_: str) -> bytes:
    return hashlib.sha256(text_.encode()).hexdigest().encode()


def test_merge_of_a_new_task_stores_its_payload(engine: Engine, app: App, installed: None) -> None:
    run_at = _future()
    with Session(engine) as s, s.begin():
        merged = s.merge(app.Task(process="p", payload={"k": 1}, run_at=run_at))
        assert merged.payload == {"k": 1}
    [(stored, digest, status)] = _raw(engine, app, "payload, payload_hash, status")
    assert (stored, bytes(digest), status) == ('{"k": 1}', _digest('{"k": 1}'), "agendada")
    assert [t.first_run_at for t in _tasks(engine, app)] == [run_at]


def test_merge_onto_a_stored_task_replaces_its_payload(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s, s.begin():
        task = app.Task(process="p", payload={"v": 1})
        s.add(task)
        s.flush()
        task_id = task.id
    with Session(engine) as s, s.begin():
        s.merge(app.Task(id=task_id, payload={"v": 2}, message="outra vez"))
    [(stored, digest, message)] = _raw(engine, app, "payload, payload_hash, mensagem")
    assert (stored, bytes(digest), message) == ('{"v": 2}', _digest('{"v": 2}'), "outra vez")


def test_merge_without_a_payload_keeps_the_stored_hash(
    engine: Engine, app: App, installed: None
) -> None:
    # a retry row: no payload text, the first attempt's hash (nsj-reference.md §4)
    first_hash = _digest('{"v": 1}')
    with Session(engine) as s, s.begin():
        task = app.Task(process="p", payload_text=None, payload_hash=first_hash)
        s.add(task)
        s.flush()
        task_id = task.id
    with Session(engine) as s, s.begin():
        s.merge(app.Task(id=task_id, message="visto"))
    [(stored, digest, message)] = _raw(engine, app, "payload, payload_hash, mensagem")
    assert (stored, bytes(digest), message) == (None, first_hash, "visto")


@pytest.mark.parametrize("with_payload", [True, False], ids=["payload", "run_at"])
def test_bulk_save_objects_is_refused(
    engine: Engine, app: App, installed: None, with_payload: bool
) -> None:
    task = (
        app.Task(process="p", payload={"k": 1})
        if with_payload
        else app.Task(process="p", run_at=_future())  # would be stored 'pendente'
    )
    with Session(engine) as s:
        with pytest.raises(StatementError) as info:
            s.bulk_save_objects([task])
        s.rollback()
    assert isinstance(info.value.orig, UnpreparedTaskError)
    message = str(info.value.orig)
    assert "\n" not in message
    assert "session.add_all()" in message and "QueueClient.insert_tasks()" in message
    assert _count(engine, app.Task) == 0


def test_orm_bulk_insert_is_prepared_like_a_flush(
    engine: Engine, app: App, installed: None
) -> None:
    run_at = _future()
    with Session(engine) as s, s.begin():
        s.execute(
            insert(app.Task),
            [
                {"process": "dict", "payload": {"k": 1}},
                {"process": "str", "payload": "123", "run_at": run_at},
                {"process": "raw", "payload_text": "texto cru"},
                {"process": "none"},
            ],
        )
        s.execute(insert(app.Task), {"process": "one", "payload": [1]})
    rows = _raw(engine, app, "processo, payload, payload_hash, status")
    assert [(p, stored, digest and bytes(digest), st) for p, stored, digest, st in rows] == [
        ("dict", '{"k": 1}', _digest('{"k": 1}'), "pendente"),
        ("str", '"123"', _digest('"123"'), "agendada"),
        ("raw", "texto cru", _digest("texto cru"), "pendente"),
        ("none", None, None, "pendente"),
        ("one", "[1]", _digest("[1]"), "pendente"),
    ]
    scheduled = _tasks(engine, app)[1]
    assert (scheduled.payload, scheduled.run_at, scheduled.first_run_at) == ("123", run_at, run_at)


def test_orm_insert_with_embedded_values_is_refused(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s:
        with pytest.raises(UnpreparedTaskError, match="from its parameters only"):
            s.execute(insert(app.Task).values(process="p", payload_text="x"))
        s.rollback()
    assert _count(engine, app.Task) == 0


def test_orm_bulk_insert_without_install_is_refused(
    engine: Engine, app: App, not_installed: None
) -> None:
    with Session(engine) as s:
        with pytest.raises(NotInstalledError):
            s.execute(insert(app.Task), [{"process": "p", "run_at": _future()}])
        s.rollback()
    assert _count(engine, app.Task) == 0


@pytest.mark.skipif(not hasattr(hybrid_property, "bulk_dml"), reason="SQLAlchemy 2.1's bulk_dml")
def test_bulk_insert_mappings_with_a_payload_is_refused(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as s:
        with pytest.raises(UnpreparedTaskError):
            s.bulk_insert_mappings(app.Task, [{"process": "p", "payload": {"k": 1}}])
        s.rollback()
    assert _count(engine, app.Task) == 0


def test_core_insert_through_a_session_is_left_alone(
    engine: Engine, app: App, not_installed: None
) -> None:
    # raw columns, like plain SQL: the caller writes what it means
    with Session(engine) as s, s.begin():
        s.execute(insert(app.Task.__table__), [{"processo": "core", "payload": "x"}])
    assert _raw(engine, app, "processo, payload, payload_hash") == [("core", "x", None)]


@pytest.mark.parametrize("form", ["values", "attribute", "hybrid", "by primary key"])
def test_orm_update_statement_setting_a_payload_is_refused(
    engine: Engine, app: App, installed: None, form: str
) -> None:
    task_id = _stored_task(engine, app)
    Task = app.Task
    by_id = update(Task).where(Task.id == task_id)
    statement, parameters = {
        "values": (by_id.values(payload_text="novo"), None),
        "attribute": (by_id.values({Task.payload_text: "novo"}), None),
        "hybrid": (by_id.values({Task.payload: "novo"}), None),
        "by primary key": (update(Task), [{"id": task_id, "payload_text": "novo"}]),
    }[form]
    with Session(engine) as s:
        with pytest.raises(UnpreparedTaskError, match=r"assign task\.payload"):
            s.execute(statement, parameters)
        s.rollback()
    [(stored, digest)] = _raw(engine, app, "payload, payload_hash")
    assert (stored, bytes(digest)) == ('{"k": 1}', _digest('{"k": 1}'))


def test_orm_update_statements_that_keep_text_and_hash_together_run(
    engine: Engine, app: App, not_installed: None
) -> None:
    task_id = _stored_task(engine, app)
    Task = app.Task
    with Session(engine) as s, s.begin():
        s.execute(update(Task).where(Task.id == task_id).values(message="visto"))
        s.execute(
            update(Task)
            .where(Task.id == task_id)
            .values(payload_text="x", payload_hash=_digest("x"))
        )
    assert _raw(engine, app, "mensagem, payload") == [("visto", "x")]


def _stored_task(engine: Engine, app: App) -> int:
    with Session(engine) as s, s.begin():
        return QueueClient(s, app.Task).insert_task(process="p", payload={"k": 1})


@pytest.mark.parametrize("hook", ["installed", "not_installed"])
def test_a_loaded_task_can_be_updated(
    engine: Engine, app: App, hook: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(hook)
    task_id = _stored_task(engine, app)
    with Session(engine) as s, s.begin():
        task = s.get(app.Task, task_id)
        assert task is not None
        task.message = "revisto"
        task.priority = 10
    [(message, priority, stored, digest)] = _raw(
        engine, app, "mensagem, prioridade, payload, payload_hash"
    )
    assert (message, priority, stored, bytes(digest)) == (
        "revisto",
        10,
        '{"k": 1}',
        _digest('{"k": 1}'),
    )


@pytest.mark.parametrize("change", ["payload", "payload_text"], ids=["payload", "payload_text"])
def test_a_new_payload_on_a_loaded_task_without_install_is_refused(
    engine: Engine, app: App, not_installed: None, change: str
) -> None:
    task_id = _stored_task(engine, app)
    with Session(engine) as s:
        task = s.get(app.Task, task_id)
        setattr(task, change, "novo")
        with pytest.raises(NotInstalledError):
            s.flush()
        s.rollback()
    [(stored, digest)] = _raw(engine, app, "payload, payload_hash")
    assert (stored, bytes(digest)) == ('{"k": 1}', _digest('{"k": 1}'))


# ---------------------------------------------------- install / uninstall
@sqlite_only
def test_flush_without_install_raises_not_installed_error(
    engine: Engine, app: App, not_installed: None
) -> None:
    with Session(engine) as s:
        s.add(app.Task(process="p", payload={"k": 1}))
        with pytest.raises(NotInstalledError) as info:
            s.flush()
        s.rollback()
    assert "sqla_queue.install(Session)" in str(info.value)
    assert _count(engine, app.Task) == 0


@sqlite_only
def test_flush_without_install_raises_for_a_task_without_payload(
    engine: Engine, app: App, not_installed: None
) -> None:
    run_at = dt.datetime.now(UTC) + dt.timedelta(hours=1)
    with Session(engine) as s:
        s.add(app.Task(process="p", run_at=run_at))
        try:
            with pytest.raises(NotInstalledError):
                s.flush()
        finally:
            s.rollback()
    assert _count(engine, app.Task) == 0


@sqlite_only
def test_install_is_idempotent_and_uninstall_undoes_it(
    engine: Engine, app: App, not_installed: None
) -> None:
    install(Session)
    install(Session)
    try:
        with Session(engine) as s, s.begin():
            s.add(app.Task(process="p", payload={"k": 1}))
    finally:
        uninstall(Session)  # once: undoes both installs
    with Session(engine) as s:
        s.add(app.Task(process="p", payload={"k": 2}))
        with pytest.raises(NotInstalledError):
            s.flush()
        s.rollback()
    assert _raw(engine, app, "payload, status") == [('{"k": 1}', "pendente")]


@sqlite_only
def test_install_on_a_sessionmaker_covers_only_its_sessions(
    engine: Engine, app: App, not_installed: None
) -> None:
    factory = sessionmaker(engine)
    install(factory)
    try:
        with factory() as s, s.begin():
            s.add(app.Task(process="factory", payload={"k": 1}))
        with Session(engine) as s:
            s.add(app.Task(process="plain", payload={"k": 2}))
            with pytest.raises(NotInstalledError):
                s.flush()
            s.rollback()
    finally:
        uninstall(factory)
    with factory() as s:
        s.add(app.Task(process="after uninstall", payload={"k": 3}))
        with pytest.raises(NotInstalledError):
            s.flush()
        s.rollback()
    assert _raw(engine, app, "processo, payload") == [("factory", '{"k": 1}')]


@sqlite_only
def test_install_on_one_session(engine: Engine, app: App, not_installed: None) -> None:
    with Session(engine) as s:
        install(s)
        try:
            s.add(app.Task(process="p", payload={"k": 1}))
            s.commit()
        finally:
            uninstall(s)
        s.add(app.Task(process="p", payload={"k": 2}))
        with pytest.raises(NotInstalledError):
            s.flush()
        s.rollback()
    assert _raw(engine, app, "payload") == [('{"k": 1}',)]


@pytest.fixture
def sessions_installed_twice() -> Iterator[None]:
    install(Session)
    install(Session)
    try:
        yield
    finally:
        uninstall(Session)


@sqlite_only
def test_double_install_prepares_each_task_once(
    engine: Engine, app: App, sessions_installed_twice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    real = sqla_queue.enqueue.events.prepare_task
    monkeypatch.setattr(
        sqla_queue.enqueue.events,
        "prepare_task",
        lambda task: (calls.append(task.process), real(task)),
    )
    with Session(engine) as s, s.begin():
        s.add(app.Task(process="once", payload={"k": 1}))
    assert calls == ["once"]
