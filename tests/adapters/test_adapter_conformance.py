"""The adapter conformance suite: every public method of ``Adapter``, on
every database.

River's driver tests (``riverdrivertest.Exercise()``) run each driver method
against every driver; this is ours. Each test states what a caller may rely
on of one method (or of a few that only mean something together) and runs
on SQLite, PostgreSQL, PostgreSQL behind a transaction-pooling PgBouncer,
MariaDB and SingleStore (when ``SQLA_QUEUE_TEST_SINGLESTORE_URL`` names a
server): the ``contract`` fixture of ``tests/adapters/conftest.py``. Where a
database lacks something, the test reads the adapter's capability flags
(``supports_notify``, ``supports_task_locks``, ``task_locks``,
``supports_vacuum``, ``single_writer``, ``claim_autocommit``,
``can_copy_text``, ``proxied``), never the dialect's name: the promise is
then that the method refuses (``UnsupportedOperationError``) or returns its
documented empty value.

The last test keeps the suite whole: a public method of ``Adapter`` that no
test of ``tests/adapters/`` calls fails it, by name.

Leases are short or pushed into the past with an UPDATE, never waited out;
what must happen on the server's time (a session ended for idling, a
notification) is polled with a deadline (``wait_until``).
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import json
import re
import threading
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_queue import UnsupportedOperationError
from sqla_queue.adapters import Adapter, ClaimFilter, ErrorKind, adapter_for
from sqla_queue.adapters import inspection as inspection_module
from sqla_queue.adapters.base import FAIR_KEY, IN_LIST_MAX, TableHealth, VacuumState
from sqla_queue.adapters.inspection import TASK_STATES, task_state
from sqla_queue.adapters.locks import routine_key
from sqla_queue.client.queue import _task_row
from sqla_queue.common.exceptions import SqlaQueueError
from sqla_queue.common.types import utcnow
from sqla_queue.enqueue.unique import unique_table
from sqla_queue.ops.status_counts import status_table
from sqla_queue.schema.configuration_table import configuration_table
from sqla_queue.schema.rows import CANCELLED_MESSAGE, SUCCESS_MESSAGE
from tests.adapters.conftest import OTHER, OWNER, Contract, past
from tests.conftest import wait_until

#: how far the database's clock and this process's may be apart (same machine)
CLOCK_TOLERANCE_SECONDS = 5.0


def _row(**values: Any) -> dict[str, Any]:
    return _task_row(
        {"processo": "faturar", "payload": {"n": 1}, **values}, pub_sub=False, now=utcnow()
    )


def _utc(value: Any) -> dt.datetime:
    """A datetime the database returned, as an aware UTC one (an expression
    of MySQL's has no column type to say it is UTC)."""
    assert isinstance(value, dt.datetime), value
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _column(contract: Contract, name: str, task_id: int) -> Any:
    c = contract.adapter.table.c
    with contract.engine.connect() as conn:
        return conn.execute(select(c[name]).where(c.id == task_id)).scalar()


def _expire(contract: Contract, *ids: int) -> None:
    """The leases of ``ids`` ran out a minute ago."""
    c = contract.adapter.table.c
    with contract.engine.begin() as conn:
        conn.execute(
            update(contract.adapter.table).where(c.id.in_(ids)).values(lease_expires_at=past(1))
        )


def _rescued(contract: Contract, limit: int = 10) -> list[int]:
    with contract.engine.begin() as conn:
        return [task.id for task in contract.adapter.task_rescue_lost(conn, limit=limit)]


def _count(contract: Contract, *where: Any) -> int:
    with contract.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(contract.adapter.table).where(*where)
            ).scalar_one()
        )


@pytest.fixture
def claim_conn(contract: Contract) -> Iterator[Connection]:
    """A worker lane's claim connection, open for the test (its per-task
    locks with it)."""
    conn = contract.adapter.connect_claim(contract.engine)
    try:
        yield conn
    finally:
        conn.close()


def _claim(
    contract: Contract,
    conn: Connection,
    *,
    limit: int = 10,
    owner: str = OWNER,
    lease_seconds: float = 30,
) -> list[int]:
    with conn.begin():
        tasks = contract.adapter.task_claim_many(
            conn, limit=limit, owner=owner, lease_seconds=lease_seconds
        )
    return [task.id for task in tasks]


# ------------------------------------------------------------------ enqueue
def test_insert_one_writes_the_row_and_returns_its_id(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = adapter.task_insert_one(conn, row=_row(processo="emitir", payload={"n": 7}))
    assert _column(contract, "processo", task_id) == "emitir"
    assert json.loads(_column(contract, "payload", task_id)) == {"n": 7}
    assert contract.status(task_id) == "pendente"


@pytest.mark.parametrize("size", [1, 3, 70])  # 70: past PostgreSQL's COPY threshold
def test_insert_many_returns_the_new_ids_in_the_rows_order(contract: Contract, size: int) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        assert adapter.task_insert_many(conn, rows=[]) == []
        ids = adapter.task_insert_many(conn, rows=[_row(payload={"n": n}) for n in range(size)])
    assert len(set(ids)) == size and ids == sorted(ids)
    with contract.engine.connect() as conn:
        payloads = dict(conn.execute(select(c.id, c.payload)).all())
    assert [json.loads(payloads[i])["n"] for i in ids] == list(range(size))


def test_copy_many_copies_rows_in_order_or_is_refused(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    rows = [_row(payload={"n": n}) for n in range(5)]
    with contract.engine.begin() as conn:
        conn.execute(select(1))
        if not adapter.can_copy_text(conn):
            with pytest.raises(UnsupportedOperationError):
                adapter.task_copy_many(conn, rows=rows)
            return
        assert adapter.task_copy_many(conn, rows=[]) == []
        ids = adapter.task_copy_many(conn, rows=rows)
    assert len(set(ids)) == 5 and ids == sorted(ids)
    with contract.engine.connect() as conn:
        payloads = dict(conn.execute(select(c.id, c.payload)).all())
    assert [json.loads(payloads[i])["n"] for i in ids] == list(range(5))
    assert {contract.status(i) for i in ids} == {"pendente"}


def test_copy_text_copies_lines_of_copy_text_or_is_refused(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    columns = ["processo", "payload", "status"]
    chunks = [
        'copiado\t{"n": 1}\tpendente\ncopiado\t{"n": 2}\tpendente\n',
        "copiado\t\\N\tpendente\n",
    ]
    with contract.engine.connect() as conn:
        assert not adapter.can_copy_text(conn)  # never outside a transaction
    with contract.engine.begin() as conn:
        conn.execute(select(1))
        if not adapter.can_copy_text(conn):
            with pytest.raises(UnsupportedOperationError):
                adapter.task_copy_text(conn, columns=columns, chunks=chunks)
            return
        adapter.task_copy_text(conn, columns=columns, chunks=chunks)
    with contract.engine.connect() as conn:
        copied = (
            conn.execute(select(c.payload).where(c.processo == "copiado").order_by(c.id))
            .scalars()
            .all()
        )
    assert copied == ['{"n": 1}', '{"n": 2}', None]


# ------------------------------------------------------------------ claims
def test_a_claim_gives_the_owner_a_lease_by_the_databases_clock(
    contract: Contract, claim_conn: Connection
) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn, payload={"pedido": 9})
    with claim_conn.begin():
        [task] = adapter.task_claim_many(claim_conn, limit=5, owner=OWNER, lease_seconds=40)
    assert (task.id, task.payload, task.process) == (task_id, {"pedido": 9}, "faturar")
    # the record's claim columns: the claim's, or (the MySQL family reads
    # before it writes) as they were; the row holds the claim's
    assert task.worker_id in (OWNER, None)
    with contract.engine.connect() as conn:
        now = _utc(conn.execute(select(adapter.now())).scalar())
    lease = _utc(_column(contract, "lease_expires_at", task_id))
    assert abs((lease - now).total_seconds() - 40) < CLOCK_TOLERANCE_SECONDS
    assert _column(contract, "worker_id", task_id) == OWNER
    assert _column(contract, "started_at", task_id) is not None
    with claim_conn.begin():  # nothing ready: an empty claim, not an error
        assert adapter.task_claim_many(claim_conn, limit=5, owner=OTHER, lease_seconds=40) == []


def test_a_claimed_retry_carries_its_first_attempts_payload(contract: Contract) -> None:
    """The seed keeps the payload on the first attempt only."""
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        first = contract.insert(conn, payload={"pedido": 41})
        retry = contract.insert(conn)
        conn.execute(update(adapter.table).where(c.id == first).values(status="falha"))
        conn.execute(
            update(adapter.table).where(c.id == retry).values(payload=None, id_inicial=first)
        )
    with contract.engine.connect() as conn, conn.begin():
        [task] = adapter.task_claim_many(conn, limit=5, owner=OWNER, lease_seconds=30)
    assert (task.id, task.initial_id, task.payload) == (retry, first, {"pedido": 41})


def test_a_claim_filter_takes_only_the_rows_it_names(contract: Contract) -> None:
    """``ClaimFilter.predicate``: processes, paused processes, a delay,
    subscribers and a fairness key, compiled into the claim."""
    adapter, engine = contract.adapter, contract.engine
    table = adapter.table

    def claimed(claim_filter: ClaimFilter) -> set[int]:
        filtered = adapter_for(
            engine.dialect,
            table,
            adapter.channel,
            task_locks=adapter.task_locks,
            claim_filter=claim_filter,
        )
        with engine.connect() as conn:
            with conn.begin():
                tasks = filtered.task_claim_many(conn, limit=50, owner=OWNER, lease_seconds=30)
            with conn.begin():  # back for the next filter
                filtered.task_hand_back_many(conn, ids=[task.id for task in tasks], owner=OWNER)
                filtered.lock_release_many(conn, ids=[task.id for task in tasks])
        return {task.id for task in tasks}

    with engine.begin() as conn:
        a_old = contract.insert(conn, processo="a", data_hora=past(5), tenant=7)
        a_new = contract.insert(conn, processo="a", data_hora=past(0.01))
        b_old = contract.insert(conn, processo="b", data_hora=past(5))
        c_old = contract.insert(conn, processo="c", data_hora=past(5), tenant=8)
        copy_s1, copy_s2, publication = (
            contract.insert(conn, processo="a", data_hora=past(5)) for _ in range(3)
        )
        _set(conn, table, copy_s1, subscriber_id="s1")
        _set(conn, table, copy_s2, subscriber_id="s2")
        _set(conn, table, publication, pub_sub=True)
    everything = {a_old, a_new, b_old, c_old, copy_s1, copy_s2, publication}
    assert claimed(ClaimFilter()) == everything
    assert claimed(ClaimFilter(processes=frozenset({"b", "c"}))) == {b_old, c_old}
    assert claimed(ClaimFilter(paused=frozenset({"a"}))) == {b_old, c_old}
    assert claimed(ClaimFilter(processes=frozenset({"a"}), delay_seconds=60)) == {
        a_old,
        copy_s1,
        copy_s2,
        publication,
    }
    assert claimed(ClaimFilter(subscriber_ids=frozenset({"s1"}))) == {copy_s1, publication}
    assert claimed(ClaimFilter(subscriber_ids=frozenset())) == {publication}
    assert claimed(ClaimFilter(all_subscribers=True)) == {copy_s1, copy_s2, publication}
    token = FAIR_KEY.set(7)
    try:
        assert claimed(ClaimFilter(fair_column="tenant")) == {a_old}
    finally:
        FAIR_KEY.reset(token)
    assert claimed(ClaimFilter(fair_column="tenant", fair_null=True)) == everything - {a_old, c_old}


def test_claim_ids_claims_only_ready_rows_among_those_given(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        ready = contract.insert(conn)
        scheduled = contract.insert(conn, data_hora=utcnow() + dt.timedelta(hours=1))
    with contract.engine.begin() as conn:
        assert adapter.task_claim_ids(conn, ids=[], owner=OWNER, lease_seconds=30) == []
        claimed = adapter.task_claim_ids(
            conn, ids=[ready, scheduled, 10**9], owner=OWNER, lease_seconds=30
        )
    assert [(t.id, t.worker_id) for t in claimed] == [(ready, OWNER)]
    assert (contract.status(ready), contract.status(scheduled)) == ("processando", "agendada")
    assert _column(contract, "lease_expires_at", ready) is not None


# ------------------------------------------------------------------ time
def test_ready_exists_sees_ready_and_due_rows_and_nothing_else(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        assert not adapter.task_ready_exists(conn)
        assert adapter.task_next_due(conn) is None
        assert adapter.task_promote_due(conn) == 0
        future = contract.insert(conn, data_hora=utcnow() + dt.timedelta(hours=2))
    with contract.engine.begin() as conn:
        assert not adapter.task_ready_exists(conn)  # scheduled, not due
        conn.execute(update(adapter.table).where(c.id == future).values(data_hora=past(1)))
    with contract.engine.begin() as conn:
        assert adapter.task_ready_exists(conn)  # due, before any promotion
        assert adapter.task_promote_due(conn) == 1
    assert contract.claim() == [future]
    with contract.engine.begin() as conn:
        assert not adapter.task_ready_exists(conn)  # claimed: not ready


def test_next_due_is_the_earliest_scheduled_time(contract: Contract) -> None:
    adapter = contract.adapter
    soon, later = (utcnow() + dt.timedelta(hours=h) for h in (1, 3))
    with contract.engine.begin() as conn:
        contract.insert(conn, data_hora=later)
        contract.insert(conn, data_hora=soon)
        contract.insert(conn, data_hora=past(10))  # pendente: not scheduled
    with contract.engine.connect() as conn:
        next_due = adapter.task_next_due(conn)
    assert next_due is not None and next_due.tzinfo is not None
    assert abs((next_due - soon).total_seconds()) < 1


# ------------------------------------------------------------------ leases
def test_a_renewed_lease_is_lease_seconds_ahead_of_the_databases_clock(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    contract.claim()
    with contract.engine.begin() as conn:
        assert adapter.task_lease_renew(conn, ids=[], owner=OWNER, lease_seconds=600) == 0
        assert (
            adapter.task_lease_renew(conn, ids=[task_id, 10**9], owner=OWNER, lease_seconds=600)
            == 1
        )
        now = _utc(conn.execute(select(adapter.now())).scalar())
    lease = _utc(_column(contract, "lease_expires_at", task_id))
    assert abs((lease - now).total_seconds() - 600) < CLOCK_TOLERANCE_SECONDS


def test_lease_deadline_now_and_clock_follow_the_databases_clock(contract: Contract) -> None:
    """``now()`` and ``clock()`` agree with this machine's clock; ``clock()``
    never runs behind ``now()``; ``lease_deadline()`` is the lease's
    seconds past them."""
    adapter = contract.adapter
    lease_params = adapter._lease_params(90)  # the parameters lease_deadline() binds
    with contract.engine.begin() as conn:
        now, clock, deadline = (
            _utc(value)
            for value in conn.execute(
                select(adapter.now(), adapter.clock(), adapter.lease_deadline()), lease_params
            ).one()
        )
        later = _utc(conn.execute(select(adapter.clock())).scalar())
    assert abs((now - utcnow()).total_seconds()) < CLOCK_TOLERANCE_SECONDS
    assert clock >= now - dt.timedelta(milliseconds=1)
    assert later >= clock - dt.timedelta(milliseconds=1)
    assert abs((deadline - now).total_seconds() - 90) < CLOCK_TOLERANCE_SECONDS


# ------------------------------------------------------------------ finish
def test_complete_many_completes_only_the_owners_claims_and_counts_them(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        mine, custom, theirs = (contract.insert(conn, data_hora=past(3 - n)) for n in range(3))
    assert contract.claim(limit=2) == [mine, custom]
    assert contract.claim(owner=OTHER) == [theirs]
    with contract.engine.begin() as conn:
        assert adapter.task_complete_many(conn, results=[], owner=OWNER) == 0
        done = adapter.task_complete_many(
            conn, results=[(mine, None), (custom, "feito"), (theirs, "x")], owner=OWNER
        )
    assert done == 2
    assert [contract.status(i) for i in (mine, custom, theirs)] == [
        "sucesso",
        "sucesso",
        "processando",
    ]
    assert _column(contract, "mensagem", theirs) is None
    assert _utc(_column(contract, "finished_at", mine)) >= _utc(
        _column(contract, "started_at", mine)
    )
    with contract.engine.begin() as conn:  # again: no longer claimed, nothing done
        assert (
            adapter.task_complete_many(conn, results=[(mine, None), (custom, None)], owner=OWNER)
            == 0
        )


def test_complete_many_writes_each_tasks_message(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        plain, custom, alone = (contract.insert(conn, data_hora=past(3 - n)) for n in range(3))
    assert contract.claim() == [plain, custom, alone]
    with contract.engine.begin() as conn:
        assert (
            adapter.task_complete_many(
                conn, results=[(plain, None), (custom, "feito")], owner=OWNER
            )
            == 2
        )
    # a batch of one whose transaction commits right after (the worker's own)
    with contract.engine.connect() as conn, conn.begin():
        assert (
            adapter.task_complete_many(conn, results=[(alone, "só")], owner=OWNER, commits=True)
            == 1
        )
    assert [_column(contract, "mensagem", i) for i in (plain, custom, alone)] == [
        SUCCESS_MESSAGE,
        "feito",
        "só",
    ]
    assert contract.status(alone) == "sucesso"


def test_a_handed_back_task_loses_its_claim(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    contract.claim()
    with contract.engine.begin() as conn:
        assert adapter.task_hand_back_many(conn, ids=[], owner=OWNER) == 0
        assert adapter.task_hand_back_many(conn, ids=[task_id], owner=OWNER) == 1
    assert contract.status(task_id) == "pendente"
    assert [
        _column(contract, name, task_id) for name in ("worker_id", "lease_expires_at", "started_at")
    ] == [None, None, None]


def test_update_claimed_writes_only_a_claim_still_held(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    contract.claim()
    with contract.engine.begin() as conn:
        assert adapter.task_update_claimed(
            conn, task_id=task_id, values={"mensagem": "a"}, owner=OWNER
        )
        assert not adapter.task_update_claimed(
            conn, task_id=task_id, values={"mensagem": "b"}, owner=None
        )
    assert _column(contract, "mensagem", task_id) == "a"
    with contract.engine.begin() as conn:
        adapter.task_complete_many(conn, results=[(task_id, None)], owner=OWNER)
    with contract.engine.begin() as conn:  # finished: no longer processando
        assert not adapter.task_update_claimed(
            conn, task_id=task_id, values={"mensagem": "c"}, owner=OWNER
        )


# ------------------------------------------------------------------ rescue
def test_the_rescue_returns_exactly_the_expired_claims_oldest_first(
    contract: Contract, claim_conn: Connection
) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        ids = [contract.insert(conn, data_hora=past(10 - n)) for n in range(4)]
        waiting = contract.insert(conn, data_hora=past(1))
    assert _claim(contract, claim_conn, limit=4) == ids
    *expired, alive = ids
    _expire(contract, *expired)
    with contract.engine.begin() as conn:  # a ready row's stale lease is no claim
        conn.execute(update(adapter.table).where(c.id == waiting).values(lease_expires_at=past(1)))
    assert _rescued(contract, limit=2) == expired[:2]
    assert _rescued(contract, limit=10) == expired
    with contract.engine.begin() as conn:
        adapter.task_complete_many(conn, results=[(i, None) for i in expired], owner=OWNER)
    assert _rescued(contract) == []  # finished rows are nobody's to rescue
    assert contract.status(alive) == "processando"


def test_released_task_locks_leave_a_claim_to_its_lease(
    contract: Contract, claim_conn: Connection
) -> None:
    """With per-task locks, a claim whose lock is released is lost at once;
    without them there was nothing to release and the lease decides."""
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    assert _claim(contract, claim_conn, lease_seconds=300) == [task_id]
    assert _rescued(contract) == []
    with claim_conn.begin():
        adapter.lock_release_many(claim_conn, ids=[])
        adapter.lock_release_many(claim_conn, ids=[task_id])
    assert _rescued(contract) == ([task_id] if adapter.task_locks else [])


# ------------------------------------------------------------------ connections
def test_the_claim_connection_commits_each_claim(
    contract: Contract, claim_conn: Connection
) -> None:
    adapter = contract.adapter
    autocommit = claim_conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    assert autocommit is adapter.claim_autocommit
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    assert _claim(contract, claim_conn) == [task_id]
    assert contract.status(task_id) == "processando"  # seen from another connection


@pytest.mark.parametrize("connect", ["connect_bulk", "connect_maintenance"])
def test_bulk_and_maintenance_connections_are_transactional(
    contract: Contract, connect: str
) -> None:
    """A rollback undoes their writes: never autocommit."""
    adapter = contract.adapter
    opened: Callable[[Engine], Connection] = {
        "connect_bulk": adapter.connect_bulk,
        "connect_maintenance": adapter.connect_maintenance,
    }[connect]
    with opened(contract.engine) as conn:
        with conn.begin():
            kept = contract.insert(conn)
        transaction = conn.begin()
        contract.insert(conn)
        conn.execute(delete(adapter.table).where(adapter.table.c.id == kept))
        transaction.rollback()
    assert _count(contract) == 1 and contract.status(kept) == "pendente"


def test_prepare_engine_is_idempotent(contract: Contract) -> None:
    adapter = contract.adapter
    adapter.prepare_engine(contract.engine)  # the fixture prepared it once already
    adapter.prepare_engine(contract.engine)
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    assert contract.claim() == [task_id]


def test_proxied_says_whether_a_pooler_stands_between(contract: Contract) -> None:
    with contract.engine.connect() as conn:
        conn.execute(select(1))
        assert contract.adapter.proxied(conn) is contract.pooled


def test_a_lane_session_stays_usable_in_and_out_of_transactions(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.connect() as conn:
        adapter.keep_lane_session(conn)
        adapter.keep_lane_session(conn)  # once per server session
        with conn.begin():
            contract.insert(conn)
        adapter.keep_lane_session(conn)
        assert conn.execute(select(func.count()).select_from(adapter.table)).scalar() == 1
        conn.rollback()
    with contract.engine.connect() as conn:  # back from the pool, reset
        assert conn.execute(select(1)).scalar() == 1


def test_guarded_engines_still_connect(contract: Contract) -> None:
    """``guard_dead_peers``: the keepalive settings are accepted by the
    driver and the server (and nothing is set without a bound)."""
    adapter = contract.adapter
    bounded = adapter_for(
        contract.engine.dialect,
        adapter.table,
        adapter.channel,
        task_locks=adapter.task_locks,
        dead_peer_seconds=10,
    )
    for chosen in (adapter, bounded):
        engine = create_engine(contract.engine.url)
        try:
            chosen.guard_dead_peers(engine, server_side=chosen.task_locks)
            chosen.guard_dead_peers(engine, server_side=chosen.task_locks)
            with engine.connect() as conn:
                assert conn.execute(select(1)).scalar() == 1
        finally:
            engine.dispose()


def test_session_names_and_marks_leave_the_session_usable(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.connect() as conn:
        with conn.begin():
            adapter.name_session(conn, "sqla-queue conformance")
            adapter.name_session(conn, "x" * 200, local=True)  # the server's limit is not ours
            adapter.mark_session(conn, owner=OWNER, slot=1)
        with conn.begin():
            adapter.unmark_session(conn, owner=OWNER, slot=1)
            assert adapter.end_sessions(conn, owners=[]) == 0
            assert conn.execute(select(1)).scalar() == 1


# ------------------------------------------------------------------ locks
def test_lock_writers_makes_the_transaction_the_only_writer(
    contract: Contract, tmp_path: Path
) -> None:
    """One writer at a time (``single_writer``): another connection's write
    is refused while the transaction holds it, as a conflict to retry.
    Elsewhere row locks guard the check-then-insert: the call changes
    nothing the transaction can see."""
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        adapter.lock_writers(conn)
        assert conn.execute(select(func.count()).select_from(adapter.table)).scalar() == 0
        contract.insert(conn)
        if adapter.single_writer:
            # an engine that does not wait for the write lock
            other = create_engine(contract.engine.url, connect_args={"timeout": 0})
            try:
                with pytest.raises(DBAPIError) as refused, other.begin() as elsewhere:
                    elsewhere.execute(insert(adapter.table).values(_row()))
            finally:
                other.dispose()
            assert adapter.classify(refused.value) is ErrorKind.TRANSIENT
            assert adapter.is_transient(refused.value)
    assert _count(contract) == 1


def test_a_bucket_lock_serialises_the_writers_of_one_bucket(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.connect() as first, contract.engine.connect() as second:
        with first.begin():
            name = adapter.bucket_lock(first, namespace=77, bucket=3, wait_seconds=0)
        if name is None:
            # the transaction held it, and its end freed it: another takes it at once
            with second.begin():
                assert adapter.bucket_lock(second, namespace=77, bucket=3, wait_seconds=0) is None
            return
        # a lock that outlives the transaction: nobody else has it until unlocked
        with pytest.raises(SqlaQueueError), second.begin():
            adapter.bucket_lock(second, namespace=77, bucket=3, wait_seconds=0)
        with second.begin():
            other = adapter.bucket_lock(second, namespace=77, bucket=4, wait_seconds=0)
        assert other is not None and other != name
        with first.begin():
            adapter.bucket_unlock(first, name)
        with second.begin():
            adapter.bucket_unlock(second, other)
            again = adapter.bucket_lock(second, namespace=77, bucket=3, wait_seconds=0)
        assert again == name
        with second.begin():
            adapter.bucket_unlock(second, again)


def test_a_released_routine_lock_is_free_for_the_next_holder(contract: Contract) -> None:
    adapter = contract.adapter
    first, second = adapter.routine_lock(contract.engine), adapter.routine_lock(contract.engine)
    try:
        assert first.try_acquire("rescue")
        assert first.try_acquire("rescue")  # held already: still ours
        first.release("rescue")
        assert second.try_acquire("rescue")
        if not adapter.needs_queue_server:  # exclusive without a lock server
            assert not first.try_acquire("rescue")
        second.release("rescue")
        second.release("rescue")  # not held: nothing
    finally:
        for lock in (first, second):
            close = getattr(lock, "close", None)
            if close is not None:
                close()


def test_routine_lock_holders_name_the_held_routine_locks(contract: Contract) -> None:
    """Where the routine locks are the database's session locks (with
    per-task locks on), it lists who holds them; elsewhere it may say
    nothing, but never names a lock nobody holds."""
    adapter = contract.adapter
    keys = {routine_key("purge"): "purge", routine_key("rescue"): "rescue"}

    def holders() -> list[Any]:
        with contract.engine.connect() as conn, conn.begin():
            return adapter.routine_lock_holders(conn, keys=keys)

    assert holders() == []
    lock = adapter.routine_lock(contract.engine)
    if hasattr(lock, "owner"):
        lock.owner = "worker-x"  # named in the server's session list (name_session)
    try:
        assert lock.try_acquire("purge")
        held = holders()
        if adapter.task_locks:
            assert [h.routine for h in held] == ["purge"]
            assert held[0].worker in ("worker-x", None) and held[0].session > 0
        else:
            assert [h.routine for h in held] in ([], ["purge"])
        lock.release("purge")
        assert holders() == []
    finally:
        close = getattr(lock, "close", None)
        if close is not None:
            close()


def test_maintenance_locks_are_exclusive_between_sessions(contract: Contract) -> None:
    adapter = contract.adapter
    key = 4242
    with contract.engine.connect() as first, contract.engine.connect() as second:
        if not adapter.supports_task_locks:  # no session lock on this database
            with pytest.raises(UnsupportedOperationError):
                adapter.lock_try(first, key=key)
            with pytest.raises(UnsupportedOperationError):
                adapter.lock_release(first, key=key)
            return
        if not adapter.task_locks:
            # behind transaction pooling a session lock is only ours within
            # one transaction (the routine lock is a lease there)
            with first.begin():
                assert adapter.lock_try(first, key=key)
                adapter.lock_release(first, key=key)
            return
        first, second = (c.execution_options(isolation_level="AUTOCOMMIT") for c in (first, second))
        assert adapter.lock_try(first, key=key)
        assert not adapter.lock_try(second, key=key)
        assert adapter.lock_try(second, key=key + 1)  # another key: another lock
        adapter.lock_release(first, key=key)
        assert adapter.lock_try(second, key=key)
        adapter.lock_release(second, key=key)
        adapter.lock_release(second, key=key + 1)


# ------------------------------------------------------------------ vacuum, health, schema
def test_vacuum_state_and_vacuum_where_the_database_needs_them(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        ids = adapter.task_insert_many(conn, rows=[_row() for _ in range(3)])
        conn.execute(delete(adapter.table).where(adapter.table.c.id == ids[0]))
    with contract.engine.connect() as conn:
        if not adapter.supports_vacuum:
            with pytest.raises(UnsupportedOperationError):
                adapter.table_vacuum_state(conn, 60)
            with pytest.raises(UnsupportedOperationError):
                adapter.table_vacuum(conn)
            return
        with conn.begin():
            state = adapter.table_vacuum_state(conn, 3600)
        assert isinstance(state, VacuumState)
        assert state.dead_tuples >= 0 and state.next_xid > 0
        assert all(holder.what and holder.xids >= 0 for holder in state.holders)
        adapter.table_vacuum(conn)
    assert _count(contract) == 2


def test_table_health_is_none_or_the_tables_sizes(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        adapter.task_insert_many(conn, rows=[_row() for _ in range(3)])
    with contract.engine.connect() as conn:
        health = adapter.table_health(conn)
    if health is None:
        assert not adapter.supports_vacuum  # the databases that count them vacuum
        return
    assert isinstance(health, TableHealth)
    assert health.table_bytes > 0 and health.index_bytes > 0
    assert health.dead_tuples >= 0 and health.live_tuples >= 0
    assert (health.horizon_seconds is None) is (health.horizon_holder is None)


def test_missing_columns_finds_a_dropped_own_column(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.connect() as conn:
        assert adapter.missing_columns(conn) == []
    quote = contract.engine.dialect.identifier_preparer.quote
    with contract.engine.begin() as conn:
        conn.execute(
            text(f"ALTER TABLE {quote(adapter.table.name)} DROP COLUMN {quote('trace_context')}")
        )
    with contract.engine.connect() as conn:
        assert adapter.missing_columns(conn) == ["trace_context"]


def test_subscriptions_are_listed_by_process_tenant_and_id(contract: Contract) -> None:
    adapter = contract.adapter
    metadata = MetaData()
    subscribers = Table(
        f"{adapter.table.name}_sub",
        metadata,
        Column("id", String(100), primary_key=True),
        Column("processo", String(250), nullable=False),
        Column("ativo", Boolean, nullable=False),
        Column("tenant", BigInteger),
        Column("grupo_empresarial", String(40)),
        Column("url", String(200)),
    )
    names = [column.name for column in subscribers.c]
    metadata.create_all(contract.engine)
    try:
        with contract.engine.begin() as conn:
            conn.execute(
                insert(subscribers),
                [
                    dict(zip(names, values, strict=True))
                    for values in (
                        ("a", "p", True, None, None, "u"),
                        ("b", "p", True, 1, "g", None),
                        ("c", "p", True, 2, None, None),
                        ("d", "p", False, None, None, None),
                        ("e", "q", True, None, None, None),
                    )
                ],
            )
        with contract.engine.connect() as conn:
            found = adapter.subscription_list(
                conn, table=subscribers, process="p", tenant=1, company_group="g"
            )
            assert [row["id"] for row in found] == ["a", "b"]
            assert found[0]["url"] == "u"
            narrow = adapter.subscription_list(
                conn, table=subscribers, process="p", tenant=2, company_group="h", columns=["id"]
            )
            assert narrow == [{"id": "a"}, {"id": "c"}]
            every = adapter.subscription_list_all(conn, table=subscribers, columns=["id", "ativo"])
            assert [(row["id"], bool(row["ativo"])) for row in every] == [
                ("a", True),
                ("b", True),
                ("c", True),
                ("d", False),
                ("e", True),
            ]
            some = adapter.subscription_get_many(
                conn, table=subscribers, ids=["e", "d", "zz"], columns=["id", "processo"]
            )
            assert sorted(some, key=lambda row: row["id"]) == [
                {"id": "d", "processo": "p"},
                {"id": "e", "processo": "q"},
            ]
    finally:
        metadata.drop_all(contract.engine)


def test_id_match_and_id_chunks_find_every_id(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        ids = adapter.task_insert_many(conn, rows=[_row() for _ in range(250)])
    chunks = adapter.id_chunks(ids)
    assert [i for chunk in chunks for i in chunk] == ids
    assert len(chunks) == 1 or all(len(chunk) <= IN_LIST_MAX for chunk in chunks)
    statement = select(c.id).where(adapter.id_match(c.id, "ids"))
    with contract.engine.connect() as conn:
        found = [i for chunk in chunks for i in conn.execute(statement, {"ids": chunk}).scalars()]
        assert conn.execute(statement, {"ids": []}).scalars().all() == []
    assert sorted(found) == ids


def test_force_index_keeps_the_statements_rows(contract: Contract) -> None:
    """The hinted statement names an index the table has (MariaDB refuses
    an unknown one) and finds what the plain one finds."""
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        ids = [contract.insert(conn, data_hora=past(n)) for n in (3, 2, 1)]
    plain = select(c.id).where(c.data_hora <= utcnow()).order_by(c.id)
    hinted = adapter.force_index(plain, f"ix_{adapter.table.name}_data_hora")
    with contract.engine.connect() as conn:
        assert conn.execute(hinted).scalars().all() == conn.execute(plain).scalars().all() == ids


# ------------------------------------------------------------------ wake-ups
def test_a_notification_wakes_the_listener(contract: Contract) -> None:
    """Where the database has NOTIFY and no pooler stands between, a
    listener hears it; behind a pooler the notification is sent but may
    reach nobody (idle lanes look on their own: docs/pgbouncer.md)."""
    adapter = contract.adapter
    with contract.engine.connect() as conn:
        conn.execute(select(1))
        proxied = adapter.proxied(conn)
        if not adapter.supports_notify:
            with pytest.raises(UnsupportedOperationError):
                adapter.notify(conn)
            with pytest.raises(UnsupportedOperationError):
                adapter.listener(contract.engine)
            return
    if proxied:
        with contract.engine.begin() as conn:
            adapter.notify(conn)
        return
    woken = threading.Event()
    listener = adapter.listener(contract.engine)
    listener.start(woken)
    try:
        # it wakes the lanes once it listens (they look for what it missed)
        wait_until(woken.is_set, timeout=30, message="the listener to listen")
        woken.clear()
        with contract.engine.begin() as conn:
            adapter.notify(conn)
        wait_until(woken.is_set, timeout=30, message="the notification")
    finally:
        listener.stop()


# ------------------------------------------------------------------ errors
def test_a_unique_violation_is_the_statements_own_error(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    with pytest.raises(DBAPIError) as caught, contract.engine.begin() as conn:
        conn.execute(insert(adapter.table).values({**_row(), "id": task_id}))
    error = caught.value
    assert adapter.classify(error) is ErrorKind.OTHER
    assert not adapter.is_transient(error) and not adapter.is_permanent(error)
    assert adapter.classify(ValueError("not a database error")) is ErrorKind.OTHER


def test_a_missing_table_is_permanent(contract: Contract) -> None:
    """Waiting cannot make a table appear: the worker stops (not
    reconnects forever)."""
    adapter = contract.adapter
    with pytest.raises(DBAPIError) as caught, contract.engine.connect() as conn:
        conn.execute(text("SELECT id FROM sqlaq_no_such_table"))
    assert adapter.is_permanent(caught.value)
    assert adapter.classify(caught.value) is ErrorKind.PERMANENT


def test_a_login_to_a_missing_database_is_permanent(contract: Contract) -> None:
    adapter = contract.adapter
    url = contract.engine.url
    if url.host is None:
        pytest.skip("an embedded database: no login")
    engine = create_engine(url.set(database="sqlaq_no_such_database"))
    try:
        with pytest.raises(DBAPIError) as caught, engine.connect():
            pass
    finally:
        engine.dispose()
    assert adapter.is_permanent(caught.value)
    assert adapter.classify(caught.value) is ErrorKind.PERMANENT


def test_a_deadlock_is_transient(contract: Contract) -> None:
    """Two transactions that each hold the row the other wants: the
    database ends one of them, and asks for it to be tried again.
    (One writer at a time has no deadlock: see the lock_writers test.)"""
    adapter = contract.adapter
    if adapter.single_writer:
        pytest.skip("one writer at a time: no two transactions hold rows")
    table, c = adapter.table, adapter.table.c
    with contract.engine.begin() as conn:
        first, second = contract.insert(conn), contract.insert(conn)
    both_hold = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def cross(mine: int, theirs: int) -> None:
        try:
            with contract.engine.begin() as conn:
                conn.execute(update(table).where(c.id == mine).values(mensagem="mine"))
                both_hold.wait()
                conn.execute(update(table).where(c.id == theirs).values(mensagem="theirs"))
        except DBAPIError as exc:
            errors.append(exc)

    thread = threading.Thread(target=cross, args=(second, first))
    thread.start()
    cross(first, second)
    thread.join(timeout=60)
    assert len(errors) == 1, errors
    assert adapter.is_transient(errors[0])
    assert adapter.classify(errors[0]) is ErrorKind.TRANSIENT


def test_a_session_the_server_ends_is_a_lost_connection(contract: Contract) -> None:
    """``end_when_idle``: where the routine locks are session locks (per-task
    locks on), the server ends a session idle past the bound, and the next
    statement's error reads as a lost connection. Elsewhere the call leaves
    the session alone, and a connection lost under the driver reads the
    same."""
    adapter = contract.adapter
    seconds = 0.5
    with contract.engine.connect() as conn:
        with conn.begin():
            adapter.end_when_idle(conn, seconds, local=True)  # for this transaction only
        adapter.end_when_idle(conn, 3600)
        assert conn.execute(select(1)).scalar() == 1
        conn.rollback()
        if adapter.task_locks:
            with conn.begin():
                adapter.end_when_idle(conn, seconds)

            def lost() -> BaseException | None:
                try:
                    with conn.begin():
                        conn.execute(select(1))
                except DBAPIError as exc:
                    return exc
                return None

            # poll slower than the bound: each poll ends the idling
            error = wait_until(
                lost,
                timeout=20,
                interval=2 * max(seconds, 1) + 0.1,
                message="the server to end the session",
            )
        else:
            conn.connection.dbapi_connection.close()  # type: ignore[union-attr]
            with pytest.raises(DBAPIError) as caught:
                conn.execute(select(1))
            error = caught.value
    assert adapter.classify(error) is ErrorKind.DISCONNECT
    assert not adapter.is_transient(error) and not adapter.is_permanent(error)


# ------------------------------------------------------------------ requeue, equivalents
def _set(conn: Connection, table: Any, task_id: int, **values: Any) -> None:
    conn.execute(update(table).where(table.c.id == task_id).values(**values))


def test_task_payloads_reads_the_payloads_of_the_rows_that_exist(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        one, two = (contract.insert(conn, payload={"n": n}) for n in (1, 2))
        _set(conn, adapter.table, two, payload=None)
    with contract.engine.connect() as conn:
        assert adapter.task_payloads(conn, ids=[]) == {}
        found = adapter.task_payloads(conn, ids=[one, two, 10**9])
    assert found.keys() == {one, two} and json.loads(found[one] or "") == {"n": 1}
    assert found[two] is None


def test_dead_heads_are_the_first_rows_of_dead_letter_runs(contract: Contract) -> None:
    adapter = contract.adapter
    table = adapter.table
    with contract.engine.begin() as conn:
        head, other_head, attempt, alive = (
            contract.insert(conn, processo=p, data_hora=past(m))
            for p, m in (("a", 30), ("b", 20), ("a", 10), ("a", 5))
        )
        _set(conn, table, head, dead=True, live_id=alive, status="falha")
        _set(conn, table, other_head, dead=True, status="falha")
        _set(conn, table, attempt, dead=True, id_inicial=head, status="falha")  # not a head
    with contract.engine.begin() as conn:
        assert [t.id for t in adapter.task_dead_heads(conn, limit=10)] == [head, other_head]
        assert [t.id for t in adapter.task_dead_heads(conn, limit=1)] == [head]
        assert [t.id for t in adapter.task_dead_heads(conn, ids=[alive], limit=10)] == [head]
        assert [t.id for t in adapter.task_dead_heads(conn, process="b", limit=10)] == [other_head]
        assert [
            t.id for t in adapter.task_dead_heads(conn, since=past(25), until=past(15), limit=10)
        ] == [other_head]
        assert adapter.task_dead_heads(conn, ids=[], limit=10) == []


def test_requeued_of_names_the_heads_a_live_chain_came_from(contract: Contract) -> None:
    adapter = contract.adapter
    table = adapter.table
    with contract.engine.begin() as conn:
        head, untouched, requeued = (contract.insert(conn) for _ in range(3))
        _set(conn, table, head, dead=True, live_id=requeued, status="falha")
        _set(conn, table, untouched, dead=True, live_id=requeued, status="falha")
        _set(conn, table, requeued, live_id=requeued, id_anterior=head)
    with contract.engine.begin() as conn:
        found = adapter.task_requeued_of(conn, live_ids=[requeued], head_ids=[head, untouched])
        assert found == {head}
        assert adapter.task_requeued_of(conn, live_ids=[10**9], head_ids=[head]) == set()


def test_equivalents_are_the_rows_with_the_same_values_in_any_status(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        waiting, running, done, different = (
            contract.insert(conn, payload={"pedido": 1 if n < 3 else 2}, chave_externa="k")
            for n in range(4)
        )
    assert contract.claim(limit=1) == [waiting]  # oldest first: the first is running
    running, waiting = waiting, running
    with contract.engine.begin() as conn:
        _set(conn, adapter.table, done, status="sucesso")
        digest = conn.execute(select(c.payload_hash).where(c.id == waiting)).scalar()
    with contract.engine.connect() as conn:
        rows = adapter.task_equivalents(conn, equal={"payload_hash": digest, "processo": "faturar"})
        assert [row.id for row in rows] == [running, waiting, done]
        pending = adapter.task_equivalents(
            conn, equal={"payload_hash": digest}, statuses=["pendente"]
        )
        assert [row.id for row in pending] == [waiting]
        mine = adapter.task_equivalents(
            conn,
            equal={"chave_externa": "k"},
            statuses=["pendente", "processando"],
            columns=["id"],
            not_null=["payload_hash"],
            any_of=("id", [running, different]),
        )
        assert sorted(row.id for row in mine) == [running, different]
        assert adapter.task_equivalents(conn, equal={"payload_hash": digest}, statuses=[]) == []


# ------------------------------------------------------------------ the adapter's parts
def test_fairness_keys_go_round_the_ready_keys(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        for tenant in (3, 1, 2, 2, None):
            contract.insert(conn, tenant=tenant)
        running = contract.insert(conn, tenant=9)
    assert adapter.fairness("tenant") is adapter.fairness("tenant")  # built once
    fair = adapter.fairness("tenant")
    with contract.engine.begin() as conn:
        adapter.task_claim_ids(conn, ids=[running], owner=OWNER, lease_seconds=30)
    with contract.engine.connect() as conn:
        assert fair.keys(conn, after=None, limit=2) == [1, 2]
        assert fair.keys(conn, after=2, limit=5) == [3, 1, 2]  # the one after comes last
        assert (fair.running(conn, 9), fair.running(conn, 2)) == (1, 0)
        assert fair.unkeyed(conn)


def test_limits_read_the_running_tasks_and_the_databases_clock(contract: Contract) -> None:
    limits = contract.adapter.limits
    with contract.engine.begin() as conn:
        contract.insert(conn)
        contract.insert(conn, processo="outro")
    contract.claim()
    with contract.engine.connect() as conn:
        assert (limits.running(conn, "faturar"), limits.running(conn, "nada")) == (1, 0)
        now = limits.now(conn)
    assert now.tzinfo is not None
    assert abs((now - utcnow()).total_seconds()) < CLOCK_TOLERANCE_SECONDS


def test_actions_cancel_and_run_now_only_waiting_tasks(contract: Contract) -> None:
    actions = contract.adapter.actions
    with contract.engine.begin() as conn:
        first = contract.insert(conn, data_hora=past(10))
        retry = contract.insert(conn, data_hora=utcnow() + dt.timedelta(hours=1))
        # a retry: of the chain enqueued first ten minutes ago
        _set(conn, contract.adapter.table, retry, id_inicial=first, data_hora_inicial=past(10))
        other = contract.insert(conn, processo="outro", data_hora=past(10))
        running = contract.insert(conn, data_hora=past(20))
    with contract.engine.begin() as conn:
        contract.adapter.task_claim_ids(conn, ids=[running], owner=OWNER, lease_seconds=30)
    with contract.engine.begin() as conn:
        assert actions.waiting_of_chain(conn, key=first) == [first, retry]
        waiting = actions.waiting_of_process(conn, process="faturar", before=utcnow(), limit=10)
        assert sorted(waiting) == [first, retry]
        assert (
            len(actions.waiting_of_process(conn, process="faturar", before=utcnow(), limit=1)) == 1
        )
        assert actions.run_now(conn, task_id=retry)
        assert not actions.run_now(conn, task_id=retry)  # pendente now: nothing to do
        assert actions.cancel(conn, ids=[first, running, other], message="cancelada") == 2
    assert [contract.status(i) for i in (first, retry, other, running)] == [
        "falha",
        "pendente",
        "falha",
        "processando",
    ]
    assert _column(contract, "mensagem", other) == "cancelada"


def test_routines_fail_expired_pending_tasks_and_delete_closed_ones(contract: Contract) -> None:
    routines = contract.adapter.routines
    with contract.engine.begin() as conn:
        old, new = contract.insert(conn, data_hora=past(60)), contract.insert(conn)
    with contract.engine.begin() as conn:
        assert routines.pending_expired_ids(conn, before=past(30), limit=10) == [old]
        assert routines.pending_fail(conn, task_id=old, status="falha", message="expirada")
        assert not routines.pending_fail(conn, task_id=old, status="falha", message="de novo")
    assert (contract.status(old), _column(contract, "mensagem", old)) == ("falha", "expirada")
    with contract.engine.begin() as conn:
        assert routines.delete_ids(conn, ids=[old, new]) == 1  # the open one stays
    assert _count(contract) == 1 and contract.status(new) == "pendente"


def test_settings_rows_are_read_written_and_inserted_once(contract: Contract) -> None:
    adapter = contract.adapter
    table = configuration_table(MetaData(), f"{adapter.table.name}_cfg")
    table.create(contract.engine)
    try:
        settings = adapter.settings(table)
        assert adapter.settings(configuration_table(MetaData(), table.name)) is settings  # by name
        row = {"setting_name": "paused", "queue_name": "q1", "value": "[]", "note": "n"}
        with contract.engine.begin() as conn:
            assert settings.row_insert(conn, row=row)
            assert not settings.row_insert(conn, row=row)  # there already: refused, not raised
            assert settings.row_insert(conn, row={**row, "queue_name": "q2", "value": "x"})
        with contract.engine.begin() as conn:
            assert settings.value_locked(conn, name="paused", queue="q1")[0] == "[]"
            assert settings.value_locked(conn, name="nothing", queue="q1") is None
            settings.value_set(conn, name="paused", queue="q1", value='["a"]')
        with contract.engine.connect() as conn:
            assert settings.value(conn, name="paused", queue="q1") == '["a"]'
            assert settings.value(conn, name="paused", queue="q3") is None
            assert settings.values_by_queue(conn, name="paused", queues=["q1", "q2", "q3"]) == {
                "q1": '["a"]',
                "q2": "x",
            }
            assert sorted(r[-1] for r in settings.rows(conn, queues=["q2"])) == ["q2"]
            assert len(settings.rows(conn, queues=None)) == 2
    finally:
        table.drop(contract.engine)


def test_routines_find_stale_tasks_and_scan_closed_chains_for_the_purge(contract: Contract) -> None:
    routines = contract.adapter.routines
    table = contract.adapter.table
    with contract.engine.begin() as conn:
        assert not routines.pending_stale_exists(conn, before=utcnow())
        first, retry, dead, other = (contract.insert(conn, data_hora=past(60)) for _ in range(4))
    with contract.engine.begin() as conn:
        assert routines.pending_stale_exists(conn, before=past(30))
        assert not routines.pending_stale_exists(conn, before=past(90))
        _set(conn, table, first, status="falha")
        _set(conn, table, retry, status="sucesso", id_inicial=first)
        _set(conn, table, dead, status="falha", dead=True, live_id=first)
    with contract.engine.connect() as conn:
        scanned = routines.purge_scan(conn, after=0, before=utcnow(), limit=10)
        assert scanned == [
            (first, None, False, None),
            (retry, first, False, None),
            (dead, None, True, first),
        ]
        assert routines.purge_scan(conn, after=first, before=utcnow(), limit=1) == [scanned[1]]
        family = {row[0]: row for row in routines.family_rows(conn, keys=[first])}
    assert family.keys() == {first, retry, dead}  # not the other chain
    assert (family[retry][1], family[dead][2], family[dead][3], family[dead][4]) == (
        first,
        True,
        first,
        "falha",
    )
    assert contract.status(other) == "pendente"


def test_unique_keys_are_reserved_taken_and_bound(contract: Contract) -> None:
    adapter = contract.adapter
    keys = unique_table(adapter.table)  # dropped with the fixture's metadata
    keys.create(contract.engine)
    unique = adapter.unique(keys)
    assert adapter.unique(keys) is unique
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
        retry = contract.insert(conn)
        _set(conn, adapter.table, retry, id_inicial=task_id)
    now = utcnow()
    with contract.engine.begin() as conn:
        try:
            unique.reserve(conn, "k1", now)
        except UnsupportedOperationError:
            return  # no unique tasks on this database
        unique.reserve(conn, "k1", now)  # there already: no error either
        assert unique.held(conn, "k1")[0] is None
        assert unique.held(conn, "k2") is None
        unique.take(conn, "k1", now)
        unique.bind(conn, "k1", task_id)
    with contract.engine.begin() as conn:
        assert unique.held(conn, "k1")[0] == task_id
        newest = unique.newest_attempt(conn, task_id)
        assert (newest.id, newest.status, newest.processo) == (retry, "pendente", "faturar")
        assert unique.newest_attempt(conn, 10**9) is None
        assert unique.replace_waiting(conn, retry, {"mensagem": "trocada"})
    contract.claim()
    with contract.engine.begin() as conn:  # claimed meanwhile: no longer waiting
        assert not unique.replace_waiting(conn, retry, {"mensagem": "de novo"})
    assert _column(contract, "mensagem", retry) == "trocada"


def test_inspection_lists_dead_letters_copies_and_model_objects(contract: Contract) -> None:
    adapter = contract.adapter
    inspection = adapter.inspection
    with contract.engine.begin() as conn:
        first, dead, copy = (contract.insert(conn, data_hora=past(5)) for _ in range(3))
        _set(conn, adapter.table, first, status="falha")
        _set(conn, adapter.table, dead, status="falha", dead=True, live_id=first)
        _set(conn, adapter.table, copy, subscriber_id="s1", publication_id=first)
    with contract.engine.connect() as conn:
        assert [
            (row.id, row.live_id, bool(row.dead)) for row in inspection.dead_letters(conn, limit=10)
        ] == [(dead, first, True)]
        assert [
            (row.id, row.subscriber_id) for row in inspection.newest_copies(conn, limit=10)
        ] == [(copy, "s1")]
    with Session(contract.engine) as session:
        found = inspection.tasks_of_model(
            session, contract.app.Task, process="faturar", status="pendente"
        )
        assert [task.id for task in found] == [copy]
    assert isinstance(inspection.writes_apart(contract.engine, after_own_connection=True), bool)


def test_inspection_keeps_the_finished_counts_per_range(contract: Contract) -> None:
    inspection = contract.adapter.inspection
    store = status_table(contract.adapter.table)  # made with the queue's metadata
    row = {"open_count": 0, "low": 1, "finished": 1.0, "counted_at": 2.0, "groups_json": "[]"}
    with contract.engine.begin() as conn:
        inspection.counts_keep(
            conn, store=store, rows=[{**row, "range_id": r} for r in (1, 2)], drop=[]
        )
    with contract.engine.begin() as conn:
        inspection.counts_keep(conn, store=store, rows=[{**row, "range_id": 3}], drop=[1, 9])
    with contract.engine.connect() as conn:
        assert sorted(kept.range_id for kept in inspection.counts_kept(conn, store=store)) == [2, 3]


def _states(contract: Contract) -> dict[str, list[int]]:
    """One row of each task state (newest first within one), and rows in
    none: a retried attempt, a dead-letter run's retry."""
    table = contract.adapter.table
    with contract.engine.begin() as conn:
        running = contract.insert(conn, processo="outro", chave_externa="k-run")
    assert contract.claim(limit=1) == [running]
    with contract.engine.begin() as conn:
        ids = {name: contract.insert(conn) for name in (
            "ready", "scheduled", "retried", "retrying", "succeeded", "failed",
            "cancelled", "dead_letter", "dead_retry",
        )}  # fmt: skip
        _set(conn, table, ids["scheduled"], status="agendada", data_hora=past(-60))
        _set(conn, table, ids["retried"], status="falha", reenfileirado=True)
        _set(conn, table, ids["retrying"], tentativa=2, id_inicial=ids["retried"])
        _set(conn, table, ids["succeeded"], status="sucesso", mensagem=SUCCESS_MESSAGE)
        _set(conn, table, ids["failed"], status="falha_processando", mensagem="boom")
        _set(conn, table, ids["cancelled"], status="falha", mensagem=CANCELLED_MESSAGE)
        _set(conn, table, ids["dead_letter"], status="falha", dead=True, live_id=ids["failed"])
        _set(conn, table, ids["dead_retry"], dead=True, tentativa=2, id_inicial=ids["dead_letter"])
    found = {state: [ids[state]] for state in TASK_STATES if state in ids}
    return {**found, "running": [running], "none": [ids["retried"], ids["dead_retry"]]}


def test_inspection_lists_tasks_by_state_newest_first_a_page_at_a_time(
    contract: Contract, monkeypatch: pytest.MonkeyPatch
) -> None:
    inspection = contract.adapter.inspection
    states = _states(contract)
    listed = sorted((i for state in TASK_STATES for i in states[state]), reverse=True)
    with contract.engine.connect() as conn:
        for state in TASK_STATES:
            page = inspection.task_page(conn, limit=10, state=state)
            assert ([row.id for row in page.rows], page.before) == (states[state], None), state
            assert [task_state(row) for row in page.rows] == [state]
            matched = conn.execute(
                select(contract.adapter.table.c.id).where(inspection.state_filter(state))
            )
            assert [row.id for row in matched] == states[state], state
        every = inspection.task_page(conn, limit=50)
        assert [row.id for row in every.rows] == listed and every.before is None
        # filters: a process, an external key, an id range, a cursor
        assert [
            row.id for row in inspection.task_page(conn, limit=50, process="outro").rows
        ] == states["running"]
        assert [
            row.id
            for row in inspection.task_page(
                conn, limit=50, state="running", external_key="k-run"
            ).rows
        ] == states["running"]
        assert inspection.task_page(conn, limit=50, state="ready", process="outro").rows == []
        low, high = listed[-3], listed[1]
        ranged = inspection.task_page(conn, limit=50, min_id=low, max_id=high)
        assert [row.id for row in ranged.rows] == [i for i in listed if low <= i <= high]
        ready = inspection.task_page(conn, limit=50, state="ready", before=states["ready"][0])
        assert ready.rows == []
        # a page at a time, whether the page or the read budget ends first
        for window, budget in ((10_000, 100_000), (1, 2)):
            monkeypatch.setattr(inspection_module, "TASK_LIST_WINDOW", window)
            monkeypatch.setattr(inspection_module, "TASK_LIST_BUDGET", budget)
            walked: list[int] = []
            before = None
            for _ in range(100):
                page = inspection.task_page(conn, limit=2, before=before)
                assert len(page.rows) <= 2
                walked += [row.id for row in page.rows]
                if page.before is None:
                    break
                before = page.before
            assert walked == listed, (window, budget)


def test_inspection_names_the_workers_holding_tasks(contract: Contract) -> None:
    inspection = contract.adapter.inspection
    with contract.engine.connect() as conn:
        assert inspection.lease_holders(conn) == []
    with contract.engine.begin() as conn:
        for _ in range(3):
            contract.insert(conn)
    claimed_at = utcnow()
    assert len(contract.claim(limit=2, owner=OWNER)) == 2
    assert len(contract.claim(limit=1, owner=OTHER)) == 1
    with contract.engine.connect() as conn:
        holders = inspection.lease_holders(conn)
    assert [(row.worker_id, row.tasks) for row in holders] == [(OWNER, 2), (OTHER, 1)]
    for row in holders:  # a 30 s lease from the claim, by the database's clock
        ahead = (_utc(row.lease_expires_at) - claimed_at).total_seconds()
        assert 30 - CLOCK_TOLERANCE_SECONDS <= ahead <= 30 + CLOCK_TOLERANCE_SECONDS
        assert abs((_utc(row.started_at) - claimed_at).total_seconds()) <= CLOCK_TOLERANCE_SECONDS


def test_archive_reads_and_deletes_whole_families(contract: Contract) -> None:
    adapter = contract.adapter
    archive = adapter.archive
    with contract.engine.begin() as conn:
        first, retry, dead, other = (contract.insert(conn) for _ in range(4))
        _set(conn, adapter.table, first, status="falha")
        _set(conn, adapter.table, retry, status="sucesso", id_inicial=first)
        _set(conn, adapter.table, dead, status="falha", dead=True, live_id=first)
    with contract.engine.connect() as conn:
        assert archive.family_roots(conn, chain_ids=[first]) == [first]
        records = archive.family_records(conn, roots=[first])
        assert sorted(record[0] for record in records) == [first, retry, dead]
        assert len(records[0]) == len(adapter.table.c)
        assert (
            archive.family_count(conn, roots=[first]),
            archive.family_count(conn, roots=[]),
        ) == (3, 0)
    with contract.engine.begin() as conn:
        assert archive.delete_closed(conn, ids=[first, retry, dead, other]) == 3  # open rows stay
    assert _count(contract) == 1 and contract.status(other) == "pendente"


# ------------------------------------------------------------------ the whole contract
#: tests of tests/adapters/ that call a method name it so: ``.name(`` or ``adapter.name``
_TESTS = Path(__file__).parent


def _public_methods() -> list[str]:
    return sorted(
        name
        for name, member in inspect.getmembers(Adapter)
        if not name.startswith("_") and callable(member)
    )


def _part_methods() -> list[str]:
    """``part.method`` of each part the adapter owns: a cached property
    (``adapter.inspection``) or a method that makes one
    (``adapter.fairness(column)``), by its return annotation."""
    found = []
    for name, member in inspect.getmembers(Adapter):
        if name.startswith("_"):
            continue
        function = member.func if isinstance(member, functools.cached_property) else member
        if not inspect.isfunction(function):
            continue
        part = typing.get_type_hints(function).get("return")
        if not inspect.isclass(part) or part.__module__ == "builtins":
            continue
        if not part.__module__.startswith("sqla_queue.adapters."):
            continue
        found += [
            f"{name}.{method}"
            for method, _ in inspect.getmembers(part, inspect.isfunction)
            if not method.startswith("_")
        ]
    return sorted(found)


def _untested(names: list[str]) -> list[str]:
    sources = "\n".join(path.read_text() for path in sorted(_TESTS.glob("test_*.py")))
    return [
        name
        for name in names
        if not re.search(
            rf"(\.{re.escape(name.rpartition('.')[2])}\(|adapter\.{re.escape(name)}\b)", sources
        )
    ]


def test_every_public_adapter_method_has_a_conformance_test() -> None:
    """A method added to ``Adapter`` without a test here fails CI."""
    untested = _untested(_public_methods())
    assert untested == [], f"Adapter methods no test of tests/adapters/ calls: {untested}"


def test_every_method_of_the_adapters_parts_has_a_conformance_test() -> None:
    """The same for the parts the adapter owns (``adapter.inspection``,
    ``adapter.fairness(column)``...): ``.method(`` somewhere in the tests."""
    parts = _part_methods()
    assert "fairness.keys" in parts  # the annotations were read
    untested = _untested(parts)
    assert untested == [], (
        f"methods of the adapter's parts no test of tests/adapters/ calls: {untested}"
    )


def test_finished_history_counts_attempts_per_bucket_process_and_outcome(
    contract: Contract,
) -> None:
    """Rows finished at chosen minutes land in their buckets; open rows, rows
    outside the window and ids outside the range are not counted."""
    inspection = contract.adapter.inspection
    table = contract.adapter.table
    since = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)
    rows = [  # (process, status, message, finished: minutes after since)
        ("a", "sucesso", SUCCESS_MESSAGE, 0),
        ("a", "sucesso", SUCCESS_MESSAGE, 0.99),
        ("a", "falha", "boom", 0.5),
        ("b", "falha", CANCELLED_MESSAGE, 0.2),
        ("b", "falha_processando", "lost", 2),
        ("a", "sucesso", SUCCESS_MESSAGE, 4.999),
        ("a", "sucesso", SUCCESS_MESSAGE, 5),  # the window's end: out
        ("a", "sucesso", SUCCESS_MESSAGE, -0.01),  # before it: out
        ("a", "pendente", None, None),
    ]
    with contract.engine.begin() as conn:
        ids = []
        for process, status, message, minutes in rows:
            task_id = contract.insert(conn, processo=process)
            finished = None if minutes is None else since + dt.timedelta(minutes=minutes)
            _set(conn, table, task_id, status=status, mensagem=message, finished_at=finished)
            ids.append(task_id)
    with contract.engine.connect() as conn:
        found = inspection.finished_history(
            conn, low=ids[0], high=ids[-1], since=since, bucket_seconds=60, buckets=5
        )
        assert [tuple(int(v) if k != 1 else v for k, v in enumerate(r)) for r in found] == [
            (0, "a", 2, 1, 0),
            (0, "b", 0, 0, 1),
            (2, "b", 0, 1, 0),
            (4, "a", 1, 0, 0),
        ]
        # a range of ids: the first three rows only; one bucket: the window
        assert [
            (int(r.bucket), r.processo, int(r.succeeded), int(r.failed))
            for r in inspection.finished_history(
                conn, low=ids[0], high=ids[2], since=since, bucket_seconds=300, buckets=1
            )
        ] == [(0, "a", 2, 1)]
        with pytest.raises(ValueError, match="buckets"):
            inspection.finished_history(
                conn, low=0, high=1, since=since, bucket_seconds=60, buckets=0
            )
