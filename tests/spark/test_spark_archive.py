"""Archive before purge, on PostgreSQL and MariaDB: whole old families go
to a Parquet dataset partitioned by day, then leave the database; crashes
injected between the steps neither lose nor duplicate a row."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, Table, delete, func, select
from sqlalchemy.orm import Session

from sqla_queue import QueueClient
from sqla_queue.common.exceptions import SparkJobError
from sqla_queue.common.types import utcnow
from sqla_queue.spark import ArchiveHook, archive_chains
from sqla_queue.spark import archive as archive_module
from tests.integration.test_worker import drain, enqueue
from tests.support.app import App
from tests.support.spark_fixtures import add_chain

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RETENTION_DAYS = 30


class Crash(Exception):
    """Stands for the process dying at that point: nothing after it runs."""


def _fill(engine: Engine, table: Table) -> dict[str, list[int]]:
    """Old closed families (some with retries and a dead-letter run), an old
    open one, an old one whose dead-letter run is recent, and recent ones."""
    old = NOW - dt.timedelta(days=40)
    made: dict[str, list[int]] = {"archived": [], "kept": []}
    with engine.begin() as conn:
        for i in range(30):
            start = old + dt.timedelta(days=i % 3, minutes=i)
            ids = add_chain(
                conn,
                table,
                process="faturar",
                tenant=i % 2,
                start=start,
                attempts=[("falha", 1, 1), ("falha", 1, 1)] if i % 5 == 0 else [("sucesso", 1, 1)],
                exhausted=i % 5 == 0,
            )
            made["archived"] += ids
            if i % 5 == 0:  # its dead-letter run, a day later: archived with it
                made["archived"] += add_chain(
                    conn,
                    table,
                    process="faturar",
                    start=start + dt.timedelta(days=1),
                    attempts=[("sucesso", 1, 1)],
                    dead=True,
                    live_id=ids[0],
                )
        made["kept"] += add_chain(
            conn,
            table,
            process="faturar",
            start=old,
            attempts=[("falha", 1, 1), ("agendada", None, None)],
        )
        late = add_chain(
            conn, table, process="faturar", start=old, attempts=[("falha", 1, 1)], exhausted=True
        )
        made["kept"] += late + add_chain(
            conn,
            table,
            process="faturar",
            start=NOW - dt.timedelta(days=2),
            attempts=[("sucesso", 1, 1)],
            dead=True,
            live_id=late[0],
        )
        for i in range(5):
            made["kept"] += add_chain(
                conn,
                table,
                process="faturar",
                start=NOW - dt.timedelta(days=3, minutes=i),
                attempts=[("sucesso", 1, 1)],
            )
    return made


def _ids(engine: Engine, table: Table) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(table.c.id)).scalars())


def _archived(spark: Any, path: Path) -> list[int]:
    """Every id in the dataset, duplicates kept."""
    return sorted(r["id"] for r in spark.read.parquet(str(path)).select("id").collect())


def test_archive_moves_old_closed_families_whole(
    spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path
) -> None:
    app, engine = jdbc_app
    table = app.Task.__table__
    made = _fill(engine, table)
    path = tmp_path / "archive"

    first = archive_chains(
        spark, engine.url, table, str(path), retention_days=RETENTION_DAYS, now=NOW,
        chunk_families=7,
    )  # fmt: skip
    assert (first.families, first.rows, first.written, first.already_archived) == (
        30,
        len(made["archived"]),
        len(made["archived"]),
        0,
    )
    assert (first.deleted, first.skipped_families) == (len(made["archived"]), 0)
    assert _archived(spark, path) == sorted(made["archived"])
    assert _ids(engine, table) == sorted(made["kept"])
    # partitioned by the day each family started: a dead-letter run with its chain
    days = {p.name for p in path.iterdir() if p.name.startswith("day=")}
    assert days == {f"day={(NOW - dt.timedelta(days=40 - d)).date()}" for d in range(3)}
    frame = spark.read.parquet(str(path))
    assert frame.where("dead").count() == 6
    types = dict(frame.dtypes)
    assert (types["payload_hash"], types["data_hora"], types["dead"]) == (
        "binary",
        "timestamp",
        "boolean",
    )


# the job's steps are the same on every database: the crashes run on
# PostgreSQL, the hook on MariaDB (each Spark job costs seconds)
@pytest.mark.parametrize("jdbc_url", ["postgresql"], indirect=True)
def test_crashes_between_archive_and_delete_neither_lose_nor_duplicate(
    spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, engine = jdbc_app
    table = app.Task.__table__
    made = _fill(engine, table)
    path = tmp_path / "archive"
    every = sorted(made["archived"] + made["kept"])

    def run() -> Any:
        return archive_chains(
            spark, engine.url, table, str(path), retention_days=RETENTION_DAYS, now=NOW
        )

    # 1. the files are staged and checked, and the run dies moving them: the
    # first file moved, the others left in _staging
    def publish_one(self: Any, staging: str, run_id: str) -> int:
        fs, path_class = self.fs, self._path_class
        files = [
            status.getPath()
            for day in fs.listStatus(path_class(staging))
            if day.isDirectory()
            for status in fs.listStatus(day.getPath())
            if status.getPath().getName().endswith(".parquet")
        ]
        target = self._child(files[0].getParent().getName())
        fs.mkdirs(target)
        fs.rename(files[0], path_class(target, f"{run_id}-{files[0].getName()}"))
        raise Crash()

    with monkeypatch.context() as patch:
        patch.setattr(archive_module._Dataset, "publish", publish_one)
        with pytest.raises(Crash):
            run()
    partial = _archived(spark, path)
    assert 0 < len(partial) < len(made["archived"])
    assert len(partial) == len(set(partial)) and set(partial) <= set(made["archived"])
    assert _ids(engine, table) == every  # nothing deleted

    # 2. the next run writes the rest, and dies before its first delete
    def crash(*args: Any) -> int:
        raise Crash()

    with monkeypatch.context() as patch:
        patch.setattr(archive_module, "_delete_chunk", crash)
        with pytest.raises(Crash):
            run()
    assert _archived(spark, path) == sorted(made["archived"])
    assert _ids(engine, table) == every

    # 3. the next run finds every row in the dataset, writes none, deletes
    rerun = run()
    assert (rerun.written, rerun.already_archived) == (0, len(made["archived"]))
    assert rerun.deleted == len(made["archived"])
    assert _archived(spark, path) == sorted(made["archived"])
    assert _ids(engine, table) == sorted(made["kept"])
    staging = path / "_staging"
    assert not staging.exists() or not any(staging.iterdir())


def _purge(conn: Connection, table: Table, roots: list[int], hook: ArchiveHook, crash: bool) -> int:
    """A stand-in for the purge routine's chunk (issue 16): the hook, then
    the DELETE of those chains and their dead-letter runs, one transaction."""
    hook(conn, table, roots)
    if crash:
        raise Crash()
    rows = archive_module.family_rows(table, roots)
    return conn.execute(delete(table).where(rows)).rowcount


@pytest.mark.parametrize("jdbc_url", ["mysql"], indirect=True)
def test_the_purge_hook_archives_each_chunk_and_a_crash_before_its_delete_duplicates_nothing(
    spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path
) -> None:
    app, engine = jdbc_app
    table = app.Task.__table__
    made = _fill(engine, table)
    hook = ArchiveHook(str(tmp_path / "archive"), spark=spark)
    c = table.c
    with engine.connect() as conn:
        roots = sorted(
            conn.execute(
                select(c.id).where(
                    c.id_inicial.is_(None), c.dead.is_(False), c.id.in_(made["archived"])
                )
            ).scalars()
        )
    chunks = [roots[:10], roots[10:]]
    with pytest.raises(Crash), engine.begin() as conn:
        _purge(conn, table, chunks[0], hook, crash=True)  # rolled back: nothing deleted
    deleted = 0
    for chunk in chunks:
        with engine.begin() as conn:
            deleted += _purge(conn, table, chunk, hook, crash=False)
    assert deleted == len(made["archived"])
    assert _archived(spark, tmp_path / "archive") == sorted(made["archived"])
    assert _ids(engine, table) == sorted(made["kept"])


@pytest.mark.parametrize("jdbc_url", ["postgresql"], indirect=True)
def test_the_hook_refuses_while_another_archive_holds_the_lock(
    spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path
) -> None:
    app, engine = jdbc_app
    table = app.Task.__table__
    made = _fill(engine, table)
    hook = ArchiveHook(str(tmp_path / "archive"), spark=spark)
    with engine.connect() as holder:
        lock = archive_module._ArchiveLock(holder, table)
        lock.take()
        try:
            with (
                pytest.raises(SparkJobError, match=r"another archive of .* is running"),
                engine.begin() as conn,
            ):
                _purge(conn, table, made["archived"][:1], hook, crash=False)
        finally:
            lock.release()
    assert len(_ids(engine, table)) == len(made["archived"]) + len(made["kept"])
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(table)).scalar_one() > 0


@pytest.mark.parametrize("jdbc_url", ["postgresql"], indirect=True)
def test_a_requeued_chain_is_archived_and_deleted_with_its_dead_task(
    spark: Any, jdbc_app: tuple[App, Engine], tmp_path: Path, installed: None
) -> None:
    """The chain requeued from a dead task belongs to the dead task's family
    (its live_id): deleted in the same chunk as the dead-letter run, never
    before it, so the dead task is not requeued a second time."""
    app, engine = jdbc_app

    class Once(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

    class Healed(app.RecordingWorker):  # type: ignore[name-defined,misc]
        def execute(self, payload: Any, task: Any, session: Session) -> str | None:
            return super().execute({"n": payload["n"]}, task, session)

    enqueue(engine, app, {"fail": "until requeued", "n": 1})
    drain(Once, engine)
    with Session(engine) as session, session.begin():
        [revived] = QueueClient(session, app.Task).requeue_dead(all_dead=True)
    drain(Healed, engine)
    table = app.Task.__table__
    every = _ids(engine, table)
    assert len(every) == 3 and revived.new_id == every[-1]
    result = archive_chains(
        spark, engine.url, table, str(tmp_path / "archive"), retention_days=RETENTION_DAYS,
        now=utcnow() + dt.timedelta(days=RETENTION_DAYS + 1), chunk_families=1,
    )  # fmt: skip
    assert (result.families, result.deleted) == (1, 3)
    assert _archived(spark, tmp_path / "archive") == every
    assert _ids(engine, table) == []
    with Session(engine) as session, session.begin():
        assert QueueClient(session, app.Task).requeue_dead(all_dead=True) == []
