"""Bulk enqueue from Spark DataFrames, on a real local SparkSession (shared,
``local[2]``) against real PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, make_url, select, text, update
from sqlalchemy.orm import Session

from sqla_queue import QueueClient, Status, WorkerBase
from sqla_queue.common.exceptions import ConfigurationError, SparkJobError
from sqla_queue.config.settings import Settings
from sqla_queue.spark import enqueue_dataframe
from tests.support.app import App

UTC = dt.timezone.utc

# Every kind of value a DataFrame column holds, and what the payload must be
# (the ORM path's text and hash for the same Python values)
PAYLOADS: list[dict[str, Any]] = [
    {
        "text": 'conteúdo "citado" \\ 𝄞 \n',
        "json_like": "123",
        "n": 7,
        "big": 2**53 + 1,
        "x": 0.1,
        "flag": True,
        "none": None,
        "price": decimal.Decimal("10.50"),
        "day": dt.date(2024, 2, 29),
        "at": dt.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        "tags": ["a", "b"],
        "inner": {"k": "v", "m": [1, 2]},
        "attrs": {"b": 2},
    },
    {
        "text": "",
        "json_like": "null",
        "n": -1,
        "big": 0,
        "x": 1e16,
        "flag": False,
        "none": None,
        "price": decimal.Decimal("-0.01"),
        "day": dt.date(5, 1, 2),
        "at": dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        "tags": [],
        "inner": {"k": None, "m": []},
        "attrs": {},
    },
]


def _schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("text", T.StringType()),
            T.StructField("json_like", T.StringType()),
            T.StructField("n", T.IntegerType()),
            T.StructField("big", T.LongType()),
            T.StructField("x", T.DoubleType()),
            T.StructField("flag", T.BooleanType()),
            T.StructField("none", T.StringType()),
            T.StructField("price", T.DecimalType(10, 2)),
            T.StructField("day", T.DateType()),
            T.StructField("at", T.TimestampType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField(
                "inner",
                T.StructType(
                    [
                        T.StructField("k", T.StringType()),
                        T.StructField("m", T.ArrayType(T.IntegerType())),
                    ]
                ),
            ),
            T.StructField("attrs", T.MapType(T.StringType(), T.IntegerType())),
            T.StructField("key", T.StringType()),
            T.StructField("tenant", T.LongType()),
            T.StructField("priority", T.IntegerType()),
            T.StructField("due", T.TimestampType()),
        ]
    )


@pytest.fixture
def pg_app(table_name: str) -> Iterator[tuple[App, Engine]]:
    """A queue table on PostgreSQL alone."""
    from sqla_queue.config.settings import normalize_url
    from tests.conftest import created_engine, server_url
    from tests.support.app import build

    app = build(table_name)
    url = normalize_url(server_url("postgresql")).render_as_string(hide_password=False)
    with created_engine(url, app.Base.metadata) as engine:
        yield app, engine


def _rows(engine: Engine, app: App) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(app.Task.__table__).order_by(app.Task.id)).all()


@pytest.mark.parametrize("scheduled", [True, False], ids=["run_at", "copy_text"])
def test_payload_text_and_hash_equal_the_orm_path(
    spark: Any, engine: Engine, app: App, installed: None, scheduled: bool
) -> None:
    # without a run time column, PostgreSQL takes the COPY text fast path
    later = dt.datetime.now(UTC) + dt.timedelta(hours=1)
    extra = [("k1", 7, 90, None), ("k2", None, None, later)]
    frame = spark.createDataFrame(
        [(*p.values(), *more) for p, more in zip(PAYLOADS, extra, strict=True)], _schema()
    ).coalesce(1)
    columns = list(PAYLOADS[0])

    result = enqueue_dataframe(
        frame,
        engine.url,
        app.Task,
        process="faturar",
        payload_cols=columns,
        external_key_col="key",
        tenant_col="tenant",
        priority_col="priority",
        run_at_col="due" if scheduled else None,
    )
    assert (result.rows, result.enqueued, result.duplicates) == (2, 2, 0)
    with Session(engine) as session, session.begin():
        session.add_all(
            app.Task(process="faturar", payload=payload, external_key=key, tenant=tenant)
            for payload, (key, tenant, _, _) in zip(PAYLOADS, extra, strict=True)
        )
    spark_rows, orm_rows = _rows(engine, app)[:2], _rows(engine, app)[2:]
    assert [r.payload for r in spark_rows] == [r.payload for r in orm_rows]
    assert [r.payload_hash for r in spark_rows] == [r.payload_hash for r in orm_rows]
    assert all(len(r.payload_hash) == 64 for r in spark_rows)
    # a TIMESTAMP is its UTC wall-clock time, a map an object, a string a string
    assert '"at": "2024-01-02T03:04:05"' in spark_rows[0].payload
    assert '"attrs": {"b": 2}' in spark_rows[0].payload
    assert '"json_like": "123"' in spark_rows[0].payload
    assert [(r.chave_externa, r.tenant, r.prioridade, r.status) for r in spark_rows] == [
        ("k1", 7, 90, "pendente"),
        ("k2", None, 50, "agendada" if scheduled else "pendente"),
    ]


# text COPY's special characters, in every column the fast path writes
AWKWARD = ["tab\there", "line\nbreak\r", "back\\slash \\N", "\\", "null", "", "𝄞 ü", None]


# printable ASCII without quote or backslash: Arrow makes the JSON text
PLAIN = ["plain", "", "with space", "a'b", "{not json", "~!#$%&()*+,-./:;<=>?@[]^_`{|}", None, "7"]


@pytest.mark.parametrize(
    ("single", "body"),
    [(True, AWKWARD), (False, AWKWARD), (False, PLAIN)],
    ids=["single", "columns", "columns-by-arrow"],
)
def test_the_copy_text_fast_path_writes_the_general_paths_rows(
    pg_app: tuple[App, Engine], single: bool, body: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    from sqla_queue.spark import writer

    app, engine = pg_app
    spec = writer.WriteSpec(
        url=engine.url.render_as_string(hide_password=False),
        table=app.Task.__table__.name,
        channel=app.Task.__table__.name,
        process="fatu\\rar\t2",
        payload_columns=("body",) if single else ("body", "n", "flag", "tenant\\"),
        single_payload=single,
        key_column="key",
        tenant_column="tenant",
        priority_column="priority",
        run_at_column=None,
        priority=None,
        run_at=None,
        dedupe=None,
    )
    count = len(body)
    batch = pa.RecordBatch.from_pydict(
        {
            "body": body,
            "n": [None if i == 3 else -(2**62) + i for i in range(count)],
            "flag": [None if i == 2 else i % 2 == 0 for i in range(count)],
            "tenant\\": pa.array(range(count), pa.int8()),
            writer.KEY: list(reversed(AWKWARD)),
            writer.TENANT: [None if i % 3 == 0 else i for i in range(count)],
            writer.PRIORITY: [None if i % 2 else i for i in range(count)],
        }
    )
    copied = writer._copy_lines(spec, batch)
    assert copied is not None and copied.count("\n") == count
    # the JSON by Arrow for plain columns, by json.dumps otherwise
    assert (writer._json_objects(spec, batch) is not None) == (body is PLAIN)

    def written() -> list[tuple[Any, ...]]:
        [result] = next(iter(writer.write_partition(spec, [batch]))).to_pylist()
        assert (result["enqueued"], result["error"]) == (count, None)
        columns = (
            *("processo", "chave_externa", "payload", "payload_hash", "tenant", "prioridade"),
            *("status", "pub_sub", "origem", "destino", "grupo_empresarial", "id_inicial"),
        )
        rows = [
            (*(row._mapping[c] for c in columns), row.data_hora is not None)
            for row in _rows(engine, app)
        ]
        with engine.begin() as conn:
            conn.execute(app.Task.__table__.delete())
        return rows

    fast = written()
    monkeypatch.setattr(writer, "_fast_path", lambda *args: False)
    assert written() == fast
    assert {row[0] for row in fast} == {"fatu\\rar\t2"}


def test_a_bad_row_on_the_fast_path_is_the_general_paths_error(
    pg_app: tuple[App, Engine],
) -> None:
    import pyarrow as pa

    from sqla_queue.spark import writer

    app, engine = pg_app
    spec = _keyed_spec(engine, app, dedupe=None)
    good = pa.RecordBatch.from_pydict({"n": [1, 2], writer.KEY: ["ok", "fine"]})
    bad = pa.RecordBatch.from_pydict({"n": [3, 4], writer.KEY: ["ok", "x" * 101]})
    # the bad row in the first batch (before the COPY starts), or in a later
    # one (the COPY is aborted halfway): the partition writes nothing
    for batches in ([bad, good], [good, good, bad]):
        [result] = next(iter(writer.write_partition(spec, batches))).to_pylist()
        assert result["enqueued"] == 0
        assert result["error"].startswith("column 'key' is longer than 100 characters; row: ")
        assert _rows(engine, app) == []
    [result] = next(iter(writer.write_partition(spec, [good, good]))).to_pylist()
    assert (result["enqueued"], result["error"]) == (4, None)


def test_single_column_payload_and_constants(spark: Any, engine: Engine, app: App) -> None:
    frame = spark.createDataFrame(
        [("plain text",), ('{"a": 1}',), (None,)], "body string"
    ).coalesce(1)
    run_at = dt.datetime(2030, 1, 1, 12, 0)  # naive: UTC

    enqueue_dataframe(
        frame, engine.url, app.Task, process="p", payload_col="body", priority=9, run_at=run_at
    )
    rows = _rows(engine, app)
    assert [r.payload for r in rows] == ["plain text", '"{\\"a\\": 1}"', None]
    assert {(r.prioridade, r.status) for r in rows} == {(9, "agendada")}
    assert {r.data_hora.replace(tzinfo=None) for r in rows} == {run_at}


class CountingWorker(WorkerBase):
    """Does nothing: the test counts the sucesso rows."""

    retry_interval_minutes = 0

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        return None


# 200,000 on PostgreSQL, the acceptance; 5,000 on MariaDB, whose
# workers claim more slowly (the same code path, in a few seconds)
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("database", "rows"), [("postgresql", 200_000), ("mysql", 5_000)], ids=["postgresql", "mysql"]
)
def test_enqueued_rows_are_all_processed_and_a_rerun_with_dedupe_adds_nothing(
    spark: Any, database: str, rows: int, table_name: str, installed: None
) -> None:
    from sqla_queue.config.settings import normalize_url
    from tests.conftest import created_engine, server_url
    from tests.support.app import build

    app = build(table_name)
    url = normalize_url(server_url(database))
    frame = (
        spark.range(rows)
        .selectExpr("id", "concat('invoice-', id) AS invoice", "id % 5 AS tenant")
        .cache()
    )
    frame.count()
    with created_engine(url.render_as_string(hide_password=False), app.Base.metadata) as engine:
        started = time.monotonic()
        first = enqueue_dataframe(
            frame, url, app.Task, process="faturar", external_key_col="invoice", tenant_col="tenant"
        )
        enqueue_seconds = time.monotonic() - started
        assert (first.rows, first.enqueued, first.duplicates) == (rows, rows, 0)

        class Worker(CountingWorker):
            model = app.Task

        assert (
            Worker().run(
                engine=engine, burst=True, concurrency=2, batch_size=1000, settings=Settings()
            )
            == 0
        )
        again = enqueue_dataframe(
            frame,
            url,
            app.Task,
            process="faturar",
            external_key_col="invoice",
            tenant_col="tenant",
            dedupe=True,
        )
        assert (again.rows, again.enqueued, again.duplicates) == (rows, 0, rows)
        with engine.connect() as conn:
            counts = conn.execute(
                select(app.Task.status, func.count()).group_by(app.Task.status)
            ).all()
        assert counts == [("sucesso", rows)]
        print(f"enqueue of {rows:,} rows on {database}: {enqueue_seconds:.1f} s")
    frame.unpersist()


def _keyed_spec(engine: Engine, app: App, dedupe: str | None = "key") -> Any:
    """A partition's spec: payload {"n": ...}, keys in column "key"."""
    from sqla_queue.spark import writer

    return writer.WriteSpec(
        url=engine.url.render_as_string(hide_password=False),
        table=app.Task.__table__.name,
        channel=app.Task.__table__.name,
        process="faturar",
        payload_columns=("n",),
        single_payload=False,
        key_column="key",
        tenant_column=None,
        priority_column=None,
        run_at_column=None,
        priority=None,
        run_at=None,
        dedupe=dedupe,
    )


def _keyed_batch(keys: list[str]) -> Any:
    import pyarrow as pa

    from sqla_queue.spark import writer

    return pa.RecordBatch.from_pydict(
        {
            "n": list(range(len(keys))),
            writer.KEY: keys,
            writer.BUCKET: [hash(k) % writer.LOCK_BUCKETS for k in keys],
        }
    )


def test_dedupe_sees_the_keys_of_tasks_in_every_status(engine: Engine, app: App) -> None:
    """Running tasks are outside the equivalence index (they are looked up
    through ix_processando): a key held by a task in any status is a duplicate."""
    from sqla_queue.spark import writer

    statuses = [status.value for status in Status]
    with engine.begin() as conn:
        client = QueueClient(conn, app.Task)
        for status in statuses:
            task_id = client.insert_task(process="faturar", external_key=status, payload={"n": 1})
            conn.execute(update(app.Task).where(app.Task.id == task_id).values(status=status))
    spec = _keyed_spec(engine, app)
    [result] = next(
        iter(writer.write_partition(spec, [_keyed_batch([*statuses, "new"])]))
    ).to_pylist()
    assert (result["enqueued"], result["duplicates"], result["error"]) == (1, len(statuses), None)


def test_dedupe_holds_when_two_attempts_of_a_partition_race(
    engine: Engine, app: App, spark: Any
) -> None:
    """Two writers of the same keys at once (a retried Spark task and its
    first attempt, or two runs of a job): each key is enqueued once."""
    from sqla_queue.spark import writer

    spec = _keyed_spec(engine, app)
    batch = _keyed_batch([f"k{i}" for i in range(300)])
    results: list[Any] = []
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def attempt() -> None:
        try:
            go.wait(timeout=30)
            results.extend(next(iter(writer.write_partition(spec, [batch]))).to_pylist())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert sorted(r["enqueued"] for r in results) == [0, 300]
    assert sorted(r["duplicates"] for r in results) == [0, 300]
    with engine.connect() as conn:
        assert conn.execute(
            select(func.count(), func.count(app.Task.external_key.distinct()))
        ).one() == (300, 300)


@pytest.mark.parametrize(
    ("schema", "rows", "options", "message"),
    [
        (
            "id long, blob binary",
            [(1, bytearray(b"ok")), (2, bytearray(b"\x00"))],
            {},
            "column 'blob' is not JSON: Object of type bytes is not JSON serializable; "
            "row: {'id': 1, 'blob': b'ok'}",
        ),
        (
            "id long, ratio double",
            [(1, 0.5), (2, float("nan"))],
            {},
            "column 'ratio' is not JSON: Out of range float values are not JSON compliant",
        ),
        (
            "id long, key string",
            [(1, "a"), (2, None)],
            {"external_key_col": "key", "dedupe": True},
            "column 'key' is null (dedupe needs a key on every row); row: {'id': 2, 'key': None}",
        ),
        (
            "id long, key string",
            [(1, "a"), (2, "x" * 101)],
            {"external_key_col": "key"},
            "column 'key' is longer than 100 characters; row: {'id': 2, 'key': 'xxx",
        ),
    ],
    ids=["binary", "nan", "null-key", "long-key"],
)
def test_a_bad_row_fails_the_job_naming_its_column_and_writes_nothing_of_its_partition(
    spark: Any,
    pg_app: tuple[App, Engine],
    schema: str,
    rows: list[Any],
    options: dict[str, Any],
    message: str,
) -> None:
    # on PostgreSQL alone: each failed job costs a fresh Python worker, and
    # the next test shows the same on MariaDB and SQLite
    app, engine = pg_app
    _refused(spark, engine, app, schema, rows, options, message)


def test_a_bad_row_rolls_its_partition_back_on_every_database(
    spark: Any, engine: Engine, app: App
) -> None:
    rows = [(i, f"k{i}") for i in range(2000)] + [(2000, None)]
    message = "column 'key' is null (dedupe needs a key on every row)"
    options = {"external_key_col": "key", "dedupe": True}
    _refused(spark, engine, app, "id long, key string", rows, options, message)


def _refused(
    spark: Any,
    engine: Engine,
    app: App,
    schema: str,
    rows: list[Any],
    options: dict[str, Any],
    message: str,
) -> None:
    frame = spark.createDataFrame(rows, schema).coalesce(1)
    with pytest.raises(SparkJobError) as error:
        enqueue_dataframe(frame, engine.url, app.Task, process="p", **options)
    assert message in str(error.value)
    assert len(str(error.value).splitlines()) == 1
    assert _rows(engine, app) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"payload_cols": ["id", "nope"]}, "payload_cols='nope': no such column"),
        ({"external_key_col": "missing"}, "external_key_col='missing': no such column"),
        ({"tenant_col": "name"}, "tenant_col='name': an integer column is needed, not string"),
        ({"run_at_col": "id"}, "run_at_col='id': a timestamp column is needed, not bigint"),
        ({"priority": 1, "priority_col": "id"}, "give priority or priority_col, not both"),
        ({"payload_col": "id", "payload_cols": ["id"]}, "give payload_cols or payload_col"),
        ({"process": ""}, "process: a name of 1 to 250 characters"),
    ],
)
def test_wrong_arguments_are_refused_before_anything_runs(
    spark: Any, options: dict[str, Any], message: str
) -> None:
    frame = spark.createDataFrame([(1, "a")], "id long, name string")
    options = {"process": "p", **options}
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        enqueue_dataframe(frame, "sqlite://", "fila", **options)


def test_a_database_error_is_one_line_without_the_password(spark: Any) -> None:
    from tests.conftest import server_url

    frame = spark.createDataFrame([(1,)], "id long")
    # the configured server, a database it does not have; its own password
    # if it has one (a trust server ignores this one)
    server = make_url(server_url("postgresql"))
    password = server.password or "s3cret"
    url = server.set(database="no_such_database_here", password=password)
    with pytest.raises(SparkJobError) as error:
        enqueue_dataframe(frame, url.render_as_string(hide_password=False), "fila", process="p")
    text_ = str(error.value)
    assert "no_such_database_here" in text_ and "does not exist" in text_
    assert str(password) not in text_
    assert len(text_.splitlines()) == 1


def test_a_connection_killed_during_the_copy_fails_the_partition_and_writes_nothing(
    pg_app: tuple[App, Engine],
) -> None:
    """The fast path's COPY, its writer thread sending: the backend is
    terminated between two batches. The partition raises one line (Spark
    retries the task), nothing of it is in the table, and nothing hangs."""
    from sqla_queue.common.exceptions import SqlaQueueError
    from sqla_queue.spark import writer

    app, engine = pg_app
    spec = _keyed_spec(engine, app, dedupe=None)
    table = app.Task.__table__.name
    terminated: list[int] = []

    def batches() -> Iterator[Any]:
        for number in range(20):
            yield _keyed_batch([f"k{number}-{i}" for i in range(2000)])
            if number == 3:
                with engine.connect() as conn:
                    terminated.extend(
                        conn.execute(
                            text(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE query LIKE :copy AND pid <> pg_backend_pid()"
                            ),
                            {"copy": f'COPY "{table}"%'},
                        ).scalars()
                    )

    started = time.monotonic()
    with pytest.raises(SqlaQueueError) as error:
        next(iter(writer.write_partition(spec, batches())))
    assert terminated == [True]
    assert time.monotonic() - started < 60
    message = str(error.value)
    assert message.startswith("[sqla-queue] partition 0: ") and len(message.splitlines()) == 1
    assert _rows(engine, app) == []


def test_each_partition_wakes_the_workers_once(spark: Any, pg_app: tuple[App, Engine]) -> None:
    import psycopg

    app, engine = pg_app
    raw = psycopg.connect(
        engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
        autocommit=True,
    )
    try:
        raw.execute(f'LISTEN "{app.Task.__table__.name}"')
        # two partitions of 2,000 rows in Arrow batches of 1,000: two COPYs each
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        try:
            frame = spark.range(4000).repartition(2)
            enqueue_dataframe(frame, engine.url, app.Task, process="p")
        finally:
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        # PostgreSQL folds a transaction's identical NOTIFYs into one
        notices = list(raw.notifies(timeout=2, stop_after=3))
    finally:
        raw.close()
    assert len(notices) == 2
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(app.Task)).scalar() == 4000
