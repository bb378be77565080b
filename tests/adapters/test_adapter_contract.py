"""The adapter contract, one suite for every database.

Each test states one promise of ``sqla_queue.adapters.base.Adapter`` and
runs on SQLite, PostgreSQL, PostgreSQL behind a transaction-pooling
PgBouncer (per-task locks off, as docs/pgbouncer.md sets it), MariaDB, and
SingleStore when ``SQLA_QUEUE_TEST_SINGLESTORE_URL`` names a server. What a
database cannot do is read from the adapter's capability flags
(``supports_notify``, ``task_locks``, ``skip_locked``, ``can_copy_text``):
where a capability is missing, the operation must raise
``UnsupportedOperationError``, never do something else.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Connection, select, update

from sqla_queue import UnsupportedOperationError
from sqla_queue.adapters import ErrorKind
from sqla_queue.client.queue import _task_row
from sqla_queue.common.types import utcnow
from tests.adapters.conftest import OTHER, OWNER, Contract, past
from tests.conftest import wait_until


# ------------------------------------------------------------------ enqueue
def test_inserted_ids_grow_and_rows_start_pendente(contract: Contract) -> None:
    with contract.engine.begin() as conn:
        first = contract.insert(conn)
        second, third = contract.adapter.task_insert_many(
            conn,
            rows=[
                _task_row({"processo": "faturar", "payload": {"n": n}}, pub_sub=False, now=utcnow())
                for n in (2, 3)
            ],
        )
    assert first < second < third
    assert {contract.status(i) for i in (first, second, third)} == {"pendente"}


# ------------------------------------------------------------------ claims
def test_a_claim_takes_ready_tasks_by_priority_then_time_then_id(contract: Contract) -> None:
    with contract.engine.begin() as conn:
        late = contract.insert(conn, data_hora=past(1))
        early = contract.insert(conn, data_hora=past(5))
        urgent = contract.insert(conn, data_hora=past(1), prioridade=90)
        future = contract.insert(conn, data_hora=utcnow() + dt.timedelta(hours=1))
    assert contract.claim(limit=2) == [urgent, early]
    assert contract.claim(limit=10) == [late]  # the future one is agendada
    assert contract.status(future) == "agendada"
    assert contract.claim() == []


def test_a_claimed_task_is_nobody_elses(contract: Contract) -> None:
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    assert contract.claim(owner=OWNER) == [task_id]
    assert contract.claim(owner=OTHER) == []
    assert contract.status(task_id) == "processando"


def test_completion_and_hand_back_are_guarded_by_the_owner(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        done, back = contract.insert(conn), contract.insert(conn)
    assert sorted(contract.claim()) == [done, back]
    with contract.engine.begin() as conn:
        assert adapter.task_complete_many(conn, results=[(done, None)], owner=OTHER) == 0
        assert adapter.task_hand_back_many(conn, ids=[back], owner=OTHER) == 0
    with contract.engine.begin() as conn:
        assert adapter.task_complete_many(conn, results=[(done, "ok")], owner=OWNER) == 1
        assert adapter.task_hand_back_many(conn, ids=[back], owner=OWNER) == 1
    assert (contract.status(done), contract.status(back)) == ("sucesso", "pendente")
    c = adapter.table.c
    with contract.engine.connect() as conn:
        assert conn.execute(select(c.mensagem).where(c.id == done)).scalar() == "ok"
    assert contract.claim() == [back]  # handed back: ready again


def test_update_claimed_checks_owner_and_lease(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    contract.claim()
    c = adapter.table.c
    with contract.engine.begin() as conn:
        lease = conn.execute(select(c.lease_expires_at).where(c.id == task_id)).scalar()
        wrong_lease = past(60)
        changed = adapter.task_update_claimed(
            conn,
            task_id=task_id,
            values={"mensagem": "x"},
            owner=OWNER,
            lease_expires_at=wrong_lease,
        )
        assert changed is False
        assert adapter.task_update_claimed(
            conn,
            task_id=task_id,
            values={"mensagem": "y"},
            owner=OWNER,
            lease_expires_at=lease,
        )
        assert not adapter.task_update_claimed(
            conn, task_id=task_id, values={"mensagem": "z"}, owner=OTHER
        )


def test_a_lease_renewal_moves_the_lease_of_the_owners_tasks(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    contract.claim()
    with contract.engine.begin() as conn:
        conn.execute(update(adapter.table).where(c.id == task_id).values(lease_expires_at=past(1)))
    with contract.engine.begin() as conn:
        assert adapter.task_lease_renew(conn, ids=[task_id], owner=OTHER, lease_seconds=60) == 0
        assert adapter.task_lease_renew(conn, ids=[task_id], owner=OWNER, lease_seconds=60) == 1
    with contract.engine.connect() as conn:
        lease = conn.execute(select(c.lease_expires_at).where(c.id == task_id)).scalar()
    assert lease is not None and lease > utcnow()


def test_given_ids_are_claimed_only_when_ready(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.begin() as conn:
        ready, later = contract.insert(conn), contract.insert(conn)
    with contract.engine.begin() as conn:
        claimed = adapter.task_claim_ids(conn, ids=[ready], owner=OWNER, lease_seconds=30)
        assert [task.id for task in claimed] == [ready]
        again = adapter.task_claim_ids(conn, ids=[ready], owner=OTHER, lease_seconds=30)
        assert again == []
    assert (contract.status(ready), contract.status(later)) == ("processando", "pendente")


# ------------------------------------------------------------------ time
def test_due_scheduled_tasks_are_promoted_and_the_next_is_known(contract: Contract) -> None:
    adapter = contract.adapter
    c = adapter.table.c
    soon = utcnow() + dt.timedelta(hours=1)
    with contract.engine.begin() as conn:
        due = contract.insert(conn, data_hora=utcnow() + dt.timedelta(minutes=1))
        later = contract.insert(conn, data_hora=soon)
        # due now: its time came while it waited
        conn.execute(update(adapter.table).where(c.id == due).values(data_hora=past(1)))
    with contract.engine.begin() as conn:
        assert adapter.task_ready_exists(conn)
        assert adapter.task_promote_due(conn) == 1
        next_due = adapter.task_next_due(conn)
    assert (contract.status(due), contract.status(later)) == ("pendente", "agendada")
    assert next_due is not None and abs((next_due - soon).total_seconds()) < 1


# ------------------------------------------------------------------ rescue
def test_the_rescue_finds_claims_whose_lease_ran_out(contract: Contract) -> None:
    """Without per-task locks (SQLite, PgBouncer, SingleStore) the lease
    alone says a claim is lost."""
    adapter = contract.adapter
    c = adapter.table.c
    with contract.engine.begin() as conn:
        lost, alive = contract.insert(conn), contract.insert(conn)
    with adapter.connect_claim(contract.engine) as claim_conn:
        with claim_conn.begin():
            adapter.task_claim_many(claim_conn, limit=2, owner=OWNER, lease_seconds=30)
        with contract.engine.begin() as conn:
            conn.execute(update(adapter.table).where(c.id == lost).values(lease_expires_at=past(1)))
        with contract.engine.begin() as conn:
            found = [task.id for task in adapter.task_rescue_lost(conn, limit=10)]
        # an expired lease is lost whatever its lock; a live lease with its
        # lock held is not
        assert found == [lost] and alive not in found


def test_a_claim_whose_lock_died_is_lost(contract: Contract) -> None:
    """With per-task locks (PostgreSQL, MariaDB), a claim is lost as soon as
    its connection (and so its lock) is gone, whatever its lease: the
    worker's claim connections never idle out (docs/lifecycle.md, Leases)."""
    adapter = contract.adapter
    if not adapter.task_locks:
        pytest.skip(f"{adapter.family}: no per-task locks here (task_locks is off)")
    with contract.engine.begin() as conn:
        task_id = contract.insert(conn)
    with adapter.connect_claim(contract.engine) as claim_conn:
        with claim_conn.begin():
            adapter.task_claim_many(claim_conn, limit=1, owner=OWNER, lease_seconds=300)
        with contract.engine.begin() as conn:
            assert adapter.task_rescue_lost(conn, limit=10) == []  # its lock is held
        claim_conn.invalidate()  # the worker died: its connection with it

    def rescued() -> list[int]:
        # the server ends the closed session's backend (and frees its lock)
        # on its own time: a busy machine takes a moment
        with contract.engine.begin() as conn:
            return [task.id for task in adapter.task_rescue_lost(conn, limit=10)]

    assert wait_until(rescued, timeout=30, message="the dead claim's lock to go") == [task_id]


# ------------------------------------------------------------------ capabilities
def test_what_a_database_cannot_do_is_refused(contract: Contract) -> None:
    adapter = contract.adapter
    with contract.engine.connect() as conn:
        if not adapter.supports_notify:
            with pytest.raises(UnsupportedOperationError):
                adapter.notify(conn)
        if adapter.family != "postgresql":
            with pytest.raises(UnsupportedOperationError):
                adapter.table_vacuum(conn)


def test_routine_locks_are_exclusive_between_two_holders(contract: Contract) -> None:
    adapter = contract.adapter
    first, second = adapter.routine_lock(contract.engine), adapter.routine_lock(contract.engine)
    try:
        assert first.try_acquire("purge")
        exclusive = adapter.family != "singlestore"  # no session lock there
        assert second.try_acquire("purge") is not exclusive
        first.release("purge")
    finally:
        for lock in (first, second):
            close = getattr(lock, "close", None)
            if close is not None:
                close()


def test_errors_are_classified_at_the_boundary(contract: Contract) -> None:
    from sqlalchemy.exc import DBAPIError

    with contract.engine.connect() as conn, pytest.raises(DBAPIError) as caught:
        conn.exec_driver_sql("SELECT no_such_column FROM no_such_table")
    # a statement's own mistake is never tried again as if the database asked
    assert contract.adapter.classify(caught.value) is not ErrorKind.TRANSIENT
    assert contract.adapter.classify(ValueError("not a database error")) is ErrorKind.OTHER


# ------------------------------------------------------------------ fencing
def test_end_sessions_ends_a_fenced_workers_marked_sessions_and_never_its_own(
    contract: Contract,
) -> None:
    """docs/lifecycle.md#network-partitions: where the server cannot probe
    one session's peer (MariaDB, MySQL), a rescue ends the sessions a
    silent worker's lanes marked; elsewhere nothing is marked or ended."""
    adapter, engine = contract.adapter, contract.engine
    named_by_lock = adapter.family == "mysql"  # GET_LOCK names; SingleStore has none
    with engine.connect() as lane, engine.connect() as rescuer:
        with lane.begin():
            adapter.mark_session(lane, owner=OWNER, slot=3)
        with rescuer.begin():
            adapter.mark_session(rescuer, owner=OTHER, slot=0)
            # the rescuer's own worker is never ended, even if asked
            assert adapter.end_sessions(rescuer, owners=[OTHER]) == 0
            assert adapter.end_sessions(rescuer, owners=["nobody"]) == 0
            ended = adapter.end_sessions(rescuer, owners=[OWNER])
        assert ended == (1 if named_by_lock else 0)
        if named_by_lock:
            wait_until(lambda: _dead(lane), 10, message="the marked session ended")
        else:
            with lane.begin():
                adapter.unmark_session(lane, owner=OWNER, slot=3)
        with rescuer.begin():
            adapter.unmark_session(rescuer, owner=OTHER, slot=0)
            assert rescuer.execute(select(1)).scalar() == 1


def _dead(conn: Connection) -> bool:
    try:
        with conn.begin():
            conn.execute(select(1))
    except Exception:
        return True
    return False
