"""SingleStore: the MySQL protocol without SKIP LOCKED, GET_LOCK or NOTIFY.

Claims are a conditional update that only one worker can win: read up to N
ready rows, then ``UPDATE ... SET status = 'processando', worker_id = TOKEN
WHERE id IN (those) AND status = 'pendente'``. A row another worker took
between the read and the update no longer matches ``status = 'pendente'``
(the update waits for the other's row lock and then sees the committed
status), so two workers never both win a row; the loser gets fewer tasks.
TOKEN is unique to this claim, so when the update changed fewer rows than it
was given, a read of the rows holding TOKEN says which were won (the lanes
of one process share a worker id, which could not tell them apart). A last
update puts the worker id in place of TOKEN, in the same transaction, so no
one else ever sees it. Three statements per claim (four under contention),
whatever N.

With no lock that dies with a connection, a killed worker's tasks are
rescued when their lease expires; the rescue's update is conditional on the
lease it read, so a worker that renewed it meanwhile keeps its task. Lease
renewals are one update guarded by the claim (status and owner).

Wake-ups and maintenance locks come from the queue server: a SingleStore
worker refuses to start without ``CLIENT_SERVER_MODE`` (sqla_queue/worker/providers.py).

Not run here: no SingleStore server is available on this machine. The DDL is
compiled with the SingleStore dialect (``ddl_singlestore.py``), and this
adapter's statements run against MariaDB, through both PyMySQL and the
``singlestoredb`` driver, in the test suite (docs/singlestore.md).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, event, select, update

from ..common.exceptions import UnsupportedOperationError
from ..schema.mixins import Status, status_is
from ..schema.records import TaskRecord
from .base import Adapter
from .locks import LocalRoutineLock, RoutineLock
from .mysql import MySQLAdapter

_NO_LOCKS = (
    "singlestore has no GET_LOCK: maintenance locks come from the queue server "
    "(CLIENT_SERVER_MODE, docs/singlestore.md)"
)


logger = logging.getLogger("sqla_queue.maintenance")


class SingleStoreAdapter(MySQLAdapter):
    family = "singlestore"
    supports_task_locks = False
    skip_locked = False
    needs_queue_server = (
        "SingleStore needs the queue server: start `sqla-queue server` and set "
        "CLIENT_SERVER_MODE=true, SERVER_HOST and SQLA_QUEUE_SERVER_SECRET "
        "(docs/singlestore.md)"
    )

    def connect_bulk(self, engine: Engine) -> Connection:
        return engine.connect()  # READ COMMITTED is its only level

    def bucket_lock(
        self, conn: Connection, *, namespace: int, bucket: int, wait_seconds: float
    ) -> str | None:
        return None  # no GET_LOCK: the dedupe's look-up is all there is

    def bucket_unlock(self, conn: Connection, name: str) -> None:
        pass

    def routine_lock(self, engine: Engine) -> RoutineLock:
        # neither advisory locks nor GET_LOCK: until a lock server is
        # configured, routines may run on several workers at once
        logger.info(
            "%s has no session lock: maintenance routines are not exclusive across workers",
            self.family,
        )
        return LocalRoutineLock(f"{engine.url}:{self.qualified_name}")

    def force_index(self, statement: Any, index: str) -> Any:
        return statement  # its own planner; the hint is MariaDB's

    # no GET_LOCK to name a session by: a silent worker's sessions are left
    # to the server (its keepalive, its timeouts)
    def mark_session(self, conn: Connection, *, owner: str, slot: int) -> None:
        pass

    def unmark_session(self, conn: Connection, *, owner: str, slot: int) -> None:
        pass

    def end_sessions(self, conn: Connection, *, owners: Sequence[str]) -> int:
        return 0

    def _prepare(self) -> None:
        super()._prepare()
        c = self.table.c
        self._take = (
            update(self.table)
            .where(self._id_in("ids"), status_is(c.status, Status.PENDING))
            .values(
                status=Status.PROCESSING.value,
                worker_id=bindparam("token"),
                lease_expires_at=self.lease_deadline(),
                started_at=self.clock(),
            )
        )
        self._won = select(c.id).where(self._id_in("ids"), c.worker_id == bindparam("token"))
        self._own = (
            update(self.table)
            .where(self._id_in("ids"), c.worker_id == bindparam("token"))
            .values(worker_id=bindparam("owner"))
        )

    def prepare_engine(self, engine: Engine) -> None:
        """The ``singlestoredb`` driver opens connections in autocommit mode,
        where SQLAlchemy's rollback undoes nothing: a failed handler's writes
        would stay, and a batch's work and its ``sucesso`` would commit apart.
        Every connection is put back in transactional mode at checkout (a
        no-op round trip when it is already)."""
        if not event.contains(engine, "checkout", _transactional):
            event.listen(engine, "checkout", _transactional)

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        result = conn.execute(self._select_ready, {"limit": limit})
        keys = list(result.keys())
        rows = result.all()
        if not rows:
            return []
        ids = [row.id for row in rows]
        token = f"claim:{uuid.uuid4().hex}"
        params = {"ids": ids, "token": token, **self._lease_params(lease_seconds)}
        taken = conn.execute(self._take, params).rowcount
        if taken == 0:
            return []
        if taken < len(ids):  # another worker won some of them
            won = set(conn.execute(self._won, {"ids": ids, "token": token}).scalars())
            rows = [row for row in rows if row.id in won]
            ids = [row.id for row in rows]
        conn.execute(self._own, {"ids": ids, "token": token, "owner": owner})
        return self._records(keys, rows, conn)

    def task_lease_renew(
        self, conn: Connection, *, ids: Sequence[int], owner: str, lease_seconds: float
    ) -> int:
        # one update guarded by the claim: without SKIP LOCKED, MySQL's
        # read-then-update would renew a row the rescue took in between
        return Adapter.task_lease_renew(
            self, conn, ids=ids, owner=owner, lease_seconds=lease_seconds
        )

    def lock_try(self, conn: Connection, *, key: int) -> bool:
        raise UnsupportedOperationError(_NO_LOCKS)

    def lock_release(self, conn: Connection, *, key: int) -> None:
        raise UnsupportedOperationError(_NO_LOCKS)


def _transactional(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    autocommit = getattr(dbapi_connection, "autocommit", None)
    get_autocommit = getattr(dbapi_connection, "get_autocommit", None)
    if callable(autocommit) and callable(get_autocommit) and get_autocommit():
        autocommit(False)
