"""The purge's statements for the workflow tables (``adapter.workflow_purge``:
the purge routine, :mod:`sqla_queue.maintenance.purge`).

A workflow's rows are its steps (``workflow_id``), and the edges and gates
owned by one of its steps or by its end (owner ``-workflow_id``:
``schema.mixins.workflow_tables``). They may go once the workflow has no
task row left: no row of the queue table is one of its steps' chains (its
``id``, or ``id_inicial`` or ``live_id``: the retries, the dead-letter runs
and the chains requeued from them). Nothing makes such a row again: a retry
and a requeue are made from a row of the chain, and ids are never given
twice (``sqlite_autoincrement``, InnoDB's counter).

Workflows are visited by id, a bounded batch at a time (the steps' index
on ``workflow_id``); the liveness test is three index look-ups of the
steps' ids (the queue table's primary key, ``ix_inicial`` and ``ix_live``)
rather than a join or one ``OR``, whose plans no planner promises: as the
chains' purge reads families.
Portable Core, built once per queue table; the caller begins and commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection, bindparam, delete, func, select

from ..common.identifiers import derived_identifier
from ..schema.mixins import inline_count, workflow_tables
from .workflow import tables_present

if TYPE_CHECKING:
    from .parts import PartOwner

__all__ = ["WorkflowPurgeQueries"]


class WorkflowPurgeQueries:
    def __init__(self, adapter: PartOwner) -> None:
        self.adapter = adapter
        table = adapter.table
        tables = workflow_tables(table)
        self.tables = (tables.steps, tables.edges, tables.gates)
        c, s = table.c, tables.steps.c
        ids = adapter.id_match
        # by the index on workflow_id, stopping after ``limit`` entries
        self._scan = (
            select(s.workflow_id)
            .where(s.workflow_id > bindparam("after"))
            .order_by(s.workflow_id)
            .limit(inline_count())
        )
        self._steps = select(s.step_id, s.workflow_id).where(ids(s.workflow_id, "ids"))
        self._alive = [
            adapter.force_index(select(column).where(ids(column, "ids")), index)
            for column, index in (
                (c.id, "PRIMARY"),
                (c.id_inicial, derived_identifier(table.name, "inicial", "ix_")),
                (c.live_id, derived_identifier(table.name, "live", "ix_")),
            )
        ]
        # each table's rows by their owner: a step's id (or -W, the end's)
        owners = (
            (tables.steps, s.step_id),
            (tables.edges, tables.edges.c.child_id),
            (tables.gates, tables.gates.c.owner_id),
        )
        self._count = [
            select(func.count()).select_from(owned).where(ids(column, "ids"))
            for owned, column in owners
        ]
        self._delete = [delete(owned).where(ids(column, "ids")) for owned, column in owners]

    def tables_exist(self, conn: Connection) -> bool:
        """Whether the database has every workflow table (a queue made
        before them has not: the purge then leaves workflows alone)."""
        return tables_present(conn, self.tables)

    def workflow_scan(self, conn: Connection, *, after: int, limit: int) -> list[int]:
        """The ``workflow_id`` of each of the first ``limit`` steps whose
        workflow's id is above ``after``, by workflow id (repeated once per
        step; the last workflow's steps may go on past ``limit``)."""
        rows = conn.execute(self._scan, {"after": after, "limit": limit})
        return [int(workflow) for workflow in rows.scalars()]

    def workflow_steps(
        self, conn: Connection, *, workflow_ids: Sequence[int]
    ) -> list[tuple[int, int]]:
        """(step_id, workflow_id) of every step of ``workflow_ids``."""
        return [
            (int(step), int(workflow))
            for chunk in self.adapter.id_chunks(sorted(set(workflow_ids)))
            for step, workflow in conn.execute(self._steps, {"ids": chunk})
        ]

    def steps_alive(self, conn: Connection, *, step_ids: Sequence[int]) -> set[int]:
        """Which of ``step_ids`` still have a task row (of any status): the
        step's own, a retry, a dead-letter run or a requeued chain."""
        alive: set[int] = set()
        for statement in self._alive:
            left = sorted(set(step_ids) - alive)
            for chunk in self.adapter.id_chunks(left) if left else []:
                alive.update(
                    int(step) for step in conn.execute(statement, {"ids": chunk}).scalars()
                )
        return alive

    def workflow_rows_count(
        self, conn: Connection, *, workflow_ids: Sequence[int], step_ids: Sequence[int]
    ) -> int:
        """How many rows the workflows ``workflow_ids``, whose steps are
        ``step_ids``, have in the workflow tables (what
        :meth:`workflow_rows_delete` would delete)."""
        return sum(
            int(conn.execute(statement, {"ids": chunk}).scalar_one())
            for statement, owners in zip(self._count, _owners(workflow_ids, step_ids), strict=True)
            for chunk in self.adapter.id_chunks(owners)
        )

    def workflow_rows_delete(
        self, conn: Connection, *, workflow_ids: Sequence[int], step_ids: Sequence[int]
    ) -> int:
        """Delete every row of the workflows ``workflow_ids``, whose steps
        are ``step_ids``, from the workflow tables (whether they still have
        task rows is the caller's test, in the same transaction); how many
        were deleted."""
        return sum(
            int(conn.execute(statement, {"ids": chunk}).rowcount)
            for statement, owners in zip(self._delete, _owners(workflow_ids, step_ids), strict=True)
            for chunk in self.adapter.id_chunks(owners)
        )


def _owners(workflow_ids: Sequence[int], step_ids: Sequence[int]) -> list[list[int]]:
    """The owner ids of each table's rows, in the order of ``tables``: the
    steps' ids; for edges and gates the ends' (``-W``) too."""
    steps = sorted(set(step_ids))
    owned = sorted(-w for w in set(workflow_ids)) + steps
    return [steps, owned, owned]
