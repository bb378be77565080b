"""SingleStore: the MySQL protocol without SKIP LOCKED or GET_LOCK.

Claims are optimistic: read candidate ids, then a conditional
``UPDATE ... WHERE id = :id AND status = 'pendente'`` per candidate; the row
is ours only if the update changed it, so two workers never both win. With
no lock that dies with a connection, a killed worker's tasks are rescued
when their lease expires (the rescue's update is conditional on the lease it
read, so a worker that renewed it meanwhile keeps its task).

Not run here: no SingleStore server is available on this machine. The DDL is
compiled with the SingleStore dialect and this claim is run against MariaDB
by the test suite (``test_conditional_claim_*``).
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select, update

from ..mixins import Status
from ..records import TaskRecord
from .mysql import MySQLAdapter


class SingleStoreAdapter(MySQLAdapter):
    family = "singlestore"
    supports_task_locks = False
    skip_locked = False

    def _prepare(self) -> None:
        super()._prepare()
        c = self.table.c
        self._candidates = (
            select(c.id)
            .where(*self._ready())
            .order_by(*self._claim_order)
            .limit(self._limit_param())
        )
        self._take = (
            update(self.table)
            .where(c.id == bindparam("b_id"), c.status == Status.PENDING.value)
            .values(
                status=Status.PROCESSING.value,
                worker_id=bindparam("owner"),
                lease_expires_at=self.lease_deadline(),
                started_at=self.clock(),
            )
        )

    def task_claim_many(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        ids = conn.execute(self._candidates, {"limit": limit}).scalars().all()
        lease = self._lease_params(lease_seconds)
        won = [
            task_id
            for task_id in ids
            if conn.execute(self._take, {"b_id": task_id, "owner": owner, **lease}).rowcount == 1
        ]
        if not won:
            return []
        return self._fetch_records(conn, self._rows_by_id, {"ids": won})
