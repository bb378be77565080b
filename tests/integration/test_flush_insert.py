"""The flush hook's fast path (sqla_queue/enqueue/flush_insert.py): a new task is
written by one Core INSERT and then behaves as a flushed ORM object; a model
or a task it cannot take goes through the unit of work, unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import BigInteger, Engine, ForeignKey, Integer, event, func, inspect, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import QueueMixin, flush_insert
from sqla_queue.common.exceptions import ConfigurationError
from tests.conftest import created_engine
from tests.support.app import App


@pytest.fixture
def inserts(engine: Engine) -> Iterator[list[str]]:
    """The INSERT statements the engine runs on queue tables."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def test_a_task_written_by_the_fast_path_is_a_flushed_persistent_object(
    engine: Engine,
    app: App,
    installed: None,
    inserts: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert flush_insert._eligible(inspect(app.Task))
    written: list[Any] = []
    real = flush_insert.adapter_of
    monkeypatch.setattr(
        flush_insert, "adapter_of", lambda *args: written.append(args) or real(*args)
    )
    with Session(engine) as session, session.begin():
        task = app.Task(process="faturar", payload={"invoice": 7}, priority=80)
        session.add(task)
        session.flush()
        state = inspect(task)
        assert len(written) == 1  # written by the fast path, not the unit of work
        assert state.persistent and task.id is not None and task not in session.new
        assert session.get(app.Task, task.id) is task  # in the identity map
        assert not state.attrs.status.history.has_changes()  # history committed
        assert task.status == "pendente" and task.payload == {"invoice": 7}
        assert task.run_at is not None and task.attempt == 1  # server defaults, loaded
        task.message = "edited"  # an ordinary UPDATE from here on
    assert len(inserts) == 1  # the task's, and no UPDATE of the stored row but the edit
    with Session(engine) as session:
        stored = session.scalars(select(app.Task)).one()
        assert (stored.message, stored.priority, stored.payload) == ("edited", 80, {"invoice": 7})


def test_a_rolled_back_fast_path_task_is_transient_again(
    engine: Engine, app: App, installed: None
) -> None:
    with Session(engine) as session:
        task = app.Task(process="faturar", payload={"n": 1})
        session.add(task)
        session.flush()
        assert inspect(task).persistent
        session.rollback()
        assert inspect(task).transient and task not in session
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(app.Task)) == 0


def test_what_the_fast_path_cannot_take_goes_through_the_unit_of_work(
    db_url: str, installed: None, monkeypatch: pytest.MonkeyPatch, table_name: str
) -> None:
    class Base(DeclarativeBase):
        pass

    class Invoice(Base):
        __tablename__ = f"{table_name}_invoice"
        id: Mapped[int] = mapped_column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True
        )

    class Task(QueueMixin, Base):
        __tablename__ = table_name
        # a foreign key: the task must follow its invoice's INSERT
        invoice_id: Mapped[int | None] = mapped_column(ForeignKey(Invoice.id))

    assert not flush_insert._eligible(inspect(Task))
    with created_engine(db_url, Base.metadata) as engine:
        with Session(engine) as session, session.begin():
            invoice = Invoice()
            session.add(invoice)
            session.flush()
            session.add(Task(process="faturar", payload={}, invoice_id=invoice.id))
            # the business row and the task in one flush, in the ORM's order
            other = Invoice()
            session.add_all([other, Task(process="faturar", payload={"x": 1})])
        with Session(engine) as session:
            assert session.scalar(select(func.count()).select_from(Task)) == 2


@pytest.mark.parametrize("case", ["explicit id", "sql expression", "turned off"])
def test_tasks_the_fast_path_leaves_alone(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    calls: list[Any] = []
    real = flush_insert._row
    monkeypatch.setattr(flush_insert, "_row", lambda *a: calls.append(a) or real(*a))
    task = app.Task(process="faturar", payload={"n": 1})
    if case == "explicit id":
        task.id = 4242
    elif case == "sql expression":
        task.priority = func.abs(-60)
    else:
        monkeypatch.setenv("SQLA_QUEUE_ORM_FAST_INSERT", "false")
    with Session(engine) as session, session.begin():
        session.add(task)
    with Session(engine) as session:
        stored = session.scalars(select(app.Task)).one()
        assert stored.status == "pendente" and stored.payload == {"n": 1}
        if case == "explicit id":
            assert stored.id == 4242
        if case == "sql expression":
            assert stored.priority == 60
    assert (calls == []) == (case == "turned off")


def test_a_bad_fast_insert_flag_is_one_clear_error_and_nothing_is_written(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SQLA_QUEUE_ORM_FAST_INSERT", "maybe")
    with pytest.raises(ConfigurationError) as raised, Session(engine) as session, session.begin():
        session.add(app.Task(process="faturar", payload={"n": 1}))
    assert str(raised.value) == "SQLA_QUEUE_ORM_FAST_INSERT must be true or false, not 'maybe'"
    monkeypatch.setenv("SQLA_QUEUE_ORM_FAST_INSERT", "OFF")
    with Session(engine) as session, session.begin():
        session.add(app.Task(process="faturar", payload={"n": 2}))
    with Session(engine) as session:
        assert [t.payload for t in session.scalars(select(app.Task))] == [{"n": 2}]


def test_consecutive_tasks_giving_the_same_columns_share_one_insert_and_keep_their_order(
    engine: Engine, app: App, installed: None, inserts: list[str]
) -> None:
    """Tasks added together are written a run at a time (consecutive tasks
    giving the same columns: one statement), their ids in the order they
    were added, whatever the runs; each object gets its own row's id."""
    with Session(engine) as session, session.begin():
        tasks = [
            app.Task(process="faturar", payload={"n": 0}),
            app.Task(process="faturar", payload={"n": 1}),
            app.Task(process="faturar", payload={"n": 2}, external_key="k2"),  # other columns
            app.Task(process="faturar", payload={"n": 3}),
            app.Task(process="faturar", payload={"n": 4}),
            app.Task(process="faturar", payload={"n": 5}),
        ]
        session.add_all(tasks)
        session.flush()
        assert all(inspect(task).persistent for task in tasks)
        ids = [task.id for task in tasks]
    assert ids == sorted(ids) and len(set(ids)) == 6
    assert len(inserts) <= 6
    with Session(engine) as session:
        stored = {t.id: (t.payload, t.external_key) for t in session.scalars(select(app.Task))}
    assert [stored[i] for i in ids] == [
        ({"n": 0}, None),
        ({"n": 1}, None),
        ({"n": 2}, "k2"),
        ({"n": 3}, None),
        ({"n": 4}, None),
        ({"n": 5}, None),
    ]


# SQLite runs a run's rows one statement each (local calls, no round trip)
@pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)
def test_a_run_of_tasks_is_one_statement_on_a_server(
    engine: Engine, app: App, installed: None, inserts: list[str]
) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(app.Task(process="faturar", payload={"n": n}) for n in range(2))
        session.add(app.Task(process="faturar", payload={"n": 2}, external_key="k2"))
        session.add_all(app.Task(process="faturar", payload={"n": n}) for n in range(3, 6))
    assert len(inserts) == 3  # [0, 1], [2], [3, 4, 5]
