"""Workflow steps that check what they see, for the workflow fault test
(tests/faults/test_workflow_faults.py), on the test application's queue
(tests/support/app.py).

``build(app)`` adds a ``<table>_step_effect`` table to the app's models and
makes :class:`FlowWorker` on its queue; worker subprocesses import this
module and get the table from ``SQLA_QUEUE_TEST_TABLE``, as with
``tests.support.app``. ``diamond(...)`` and ``chain_of(...)`` build the
two workflows whose steps it runs.

Each step's handler writes one ``StepEffect`` row through its session, so
the row commits with the step's ``sucesso`` or not at all. The table has
no unique constraint on ``step``: a step whose work committed twice leaves
two rows, and the test counts them. Before writing, the handler reads, in
the same transaction, how many effects of its parents had committed and
what ``task.parent_results()`` returned, and stores what it saw in
``seen`` (JSON): the test checks that a step ran only after its parents
committed, from the database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, String, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from sqla_queue import WorkerBase, Workflow, chain, group
from tests.support import app as sync_app
from tests.support.app import App

#: the process of every step (the payload says which step it is)
PROCESS = "etapa"


@dataclass
class FlowApp:
    app: App
    StepEffect: Any
    FlowWorker: type[WorkerBase]


def step_key(flow: str, role: str, n: int) -> str:
    """A step's name: unique within a queue, the key its effect is counted by."""
    return f"{flow}:{role}:{n}"


def parents_of(flow: str, role: str, n: int, size: int) -> list[str]:
    """The names of a step's parents, in its ``parent_results()`` order."""
    if role == "member":
        return [step_key(flow, "head", 0)]
    if role == "callback":
        return [step_key(flow, "member", i) for i in range(size)]
    if role == "link" and n > 0:
        return [step_key(flow, "link", n - 1)]
    return []


def _step(app: App, flow: str, role: str, n: int, size: int) -> Any:
    payload = {"flow": flow, "role": role, "n": n, "size": size}
    return app.Task(process=PROCESS, payload=payload)


def diamond(app: App, flow: str, size: int) -> Workflow:
    """One head, ``size`` members side by side after it, one callback after
    all of them."""
    members = [_step(app, flow, "member", n, size) for n in range(size)]
    return chain(_step(app, flow, "head", 0, size), group(*members)).then(
        _step(app, flow, "callback", 0, size)
    )


def chain_of(app: App, flow: str, size: int) -> Workflow:
    """``size`` steps one after another."""
    return chain(*(_step(app, flow, "link", n, size) for n in range(size)))


def build(app: App) -> FlowApp:
    class StepEffect(app.Base):  # type: ignore[name-defined,misc]
        """One row per committed run of a step, and what the step saw."""

        __tablename__ = f"{app.Task.__tablename__}_step_effect"
        id: Mapped[int] = mapped_column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True
        )
        step: Mapped[str] = mapped_column(String(60), index=True)
        task_id: Mapped[int] = mapped_column(BigInteger)
        chain_id: Mapped[int] = mapped_column(BigInteger)
        seen: Mapped[str] = mapped_column(String(400))

    def committed(session: Session, *where: Any) -> tuple[int, int]:
        """Effect rows matching ``where``, and distinct steps among them, as
        this transaction reads them."""
        rows, steps = session.execute(
            select(func.count(), func.count(func.distinct(StepEffect.step))).where(*where)
        ).one()
        return int(rows), int(steps)

    class FlowWorker(app.RecordingWorker):  # type: ignore[name-defined,misc]
        """Runs a step of :func:`diamond` or :func:`chain_of`: reads what
        its parents left, writes its effect, returns its name."""

        def execute(self, payload: Any, task: Any, session: Session) -> Any:
            flow, role, n, size = payload["flow"], payload["role"], payload["n"], payload["size"]
            results = task.parent_results()
            parents = parents_of(flow, role, n, size)
            rows, steps = committed(session, StepEffect.step.in_(parents)) if parents else (0, 0)
            seen = {
                "parent_rows": rows,
                "parent_steps": steps,
                "results": len(results),
                "results_as_expected": results == [{"step": parent} for parent in parents],
            }
            key = step_key(flow, role, n)
            session.add(
                StepEffect(step=key, task_id=task.id, chain_id=task.chain_id, seen=json.dumps(seen))
            )
            return {"step": key}

    return FlowApp(app, StepEffect, FlowWorker)


_flow = build(sync_app._app)
FlowWorker = _flow.FlowWorker
