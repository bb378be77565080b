"""What a workflow is doing, step by step (``sqla-queue status --workflow
ID``, the dashboard's ``/workflows/ID`` and ``/api/workflows/ID``).

Each step of a workflow is a task's chain (docs/workflows.md). Its state
is that of the newest of its chains: the step's own, or a dead-letter run
of it, or a chain requeued from one (each a new chain that names the one
it came from in ``live_id``). In the contract's words:

============  ===========================================================
step state    newest chain, newest attempt (``sqla-queue status``'s word)
============  ===========================================================
waiting       ``agendada`` with no time: it waits for its parents
ready         ``pendente`` (ready, or retrying), ``agendada`` with a time
              (scheduled, or a retry waiting out its backoff: retrying)
running       ``processando``
succeeded     ``sucesso``
failed        ``falha`` or ``falha_processando``, no retry after it and no
              dead-letter run (yet): its attempts are spent
cancelled     ``falha`` with the cancellation's message (the stop policy,
              ``cancel_workflow``, ``sqla-queue cancel``)
dead_letter   the newest chain is a dead-letter run: the step exhausted its
              attempts and waits for a person (a requeue resumes it)
============  ===========================================================

A retry is ``ready``, not ``running``: nothing runs it until its time
comes and a worker claims it; ``task_state`` says ``retrying``. Two more
words for what the contract does not foresee: ``purged``, a step whose
rows the purge deleted (its outcome is gone with them; a step cancelled
before is still ``cancelled``), and ``unknown``, a status sqla-queue does
not write.

The workflow's state: ``running`` while a step is ready or running; once
none is, ``dead_letter``, ``failed`` or ``cancelled`` when a step is (in
that order: under the stop policy a dead step's descendants are
cancelled, and the dead step is the cause), ``waiting`` when steps still
wait with nothing to release them (a dead step under the stop policy that
was requeued, until its requeued chain runs), ``succeeded`` when every
step did.

:func:`workflow_svg` draws the graph on the server (no script, no asset
from elsewhere): steps in columns by depth, left to right, a box per step
coloured by its state, an arrow per edge. A column of more than
:data:`COLLAPSE_OVER` steps is one box that counts them by state, and a
workflow deeper than :data:`MAX_COLUMNS` shares columns between
consecutive depths (a 10,000-step chain is 100 boxes of 100 steps). Every
text from the database is escaped.

Everything here reads; nothing writes or locks. The steps, edges and rows
are read in one transaction's statements, one after the other: on a busy
queue a step that moves between two of them shows either state.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from ..client.queue import resolve_table
from ..common.exceptions import TaskNotFoundError
from ..common.redaction import escape_controls, redact_json
from ..schema.mixins import STEP_CANCELLED, STEP_COMPENSATION, Status
from .status import Bind, Queue, _adapter, _connection, _table_name

__all__ = [
    "COLLAPSE_OVER",
    "MAX_COLUMNS",
    "PARENTS_SHOWN",
    "STEP_STATES",
    "StepStatus",
    "WorkflowStatus",
    "workflow_of",
    "workflow_status",
    "workflow_svg",
]

#: a step's states, as the contract names them (issue 51)
STEP_STATES = ("waiting", "ready", "running", "succeeded", "failed", "cancelled", "dead_letter")
#: a column of the graph with more steps than this is drawn as one box
COLLAPSE_OVER = 20
#: the graph's columns at most; a deeper workflow shares them
MAX_COLUMNS = 100
#: a step's parents a table names at most
PARENTS_SHOWN = 8
#: requeued chains followed at most per step (each requeue after a
#: requeued chain died again is one more)
MAX_REQUEUES_FOLLOWED = 100

_PENDING = Status.PENDING.value
_SCHEDULED = Status.SCHEDULED.value
_FAILED = (Status.FAILED.value, Status.FAILED_PROCESSING.value)
_SIMPLE = {
    Status.PROCESSING.value: "running",
    Status.SUCCEEDED.value: "succeeded",
}


@dataclass(frozen=True)
class StepStatus:
    """One step: ``id`` (its first task's id, ``status --task`` takes it),
    ``state`` (:data:`STEP_STATES`, or ``purged``, ``unknown``: see the
    module), ``parents`` in their order, ``depth`` (the longest way from a
    first step), ``task_id`` and ``attempt`` of its newest row, and
    ``task_state``, its chain's state as ``sqla-queue status`` counts it
    (``scheduled``, ``retrying`` where ``state`` says ``ready``). ``result``
    is its handler's return value (None when it returned None),
    decoded."""

    id: int
    state: str
    process: str | None
    parents: tuple[int, ...]
    depth: int
    task_id: int | None
    attempt: int | None
    task_state: str | None
    result: Any = None
    #: the workflow's compensation step (runs only if the workflow fails;
    #: cancelled when it succeeds): not part of the workflow's state
    compensation: bool = False

    @property
    def label(self) -> str:
        """The state for a person: ``ready (retrying)``, ``ready
        (scheduled)`` for a step that waits for its time."""
        if self.state == "ready" and self.task_state in ("retrying", "scheduled"):
            return f"ready ({self.task_state})"
        return self.state

    def parents_shown(self, most: int = PARENTS_SHOWN) -> str:
        """The parents for a table's cell: the first ``most``, and how many
        in all when there are more (a group's callback has thousands)."""
        shown = ", ".join(map(str, self.parents[:most])) or "-"
        if len(self.parents) > most:
            shown += f", … ({len(self.parents):,} in all)"
        return shown

    def as_dict(self) -> dict[str, Any]:
        """The step in ``--json``: the contract's ``id`` and ``state``, then
        the rest; the result with its secrets masked, as the dashboard
        shows payloads."""
        return {
            "id": self.id,
            "state": self.state,
            "process": self.process,
            "parents": list(self.parents),
            "depth": self.depth,
            "task_id": self.task_id,
            "attempt": self.attempt,
            "task_state": self.task_state,
            "result": redact_json(self.result),
            "compensation": self.compensation,
        }


@dataclass(frozen=True)
class WorkflowStatus:
    """A workflow: its id (its first step's), its state (see the module),
    its failure policy and its steps by id."""

    workflow: int
    state: str
    on_failure: str
    queue: str
    steps: list[StepStatus]

    def counts(self) -> dict[str, int]:
        """Steps per state, in :data:`STEP_STATES` order (then any other)."""
        found = Counter(step.state for step in self.steps)
        ordered = [state for state in STEP_STATES if found[state]]
        return {state: found[state] for state in [*ordered, *sorted(set(found) - set(ordered))]}

    def as_dict(self) -> dict[str, Any]:
        """What ``status --workflow ID --json`` prints and ``GET
        /api/workflows/ID`` answers: ``{"workflow": ID, "state": ...,
        "steps": [{"id": ..., "state": ...}, ...]}`` and more keys."""
        return {
            "workflow": self.workflow,
            "state": self.state,
            "on_failure": self.on_failure,
            "queue": self.queue,
            "counts": self.counts(),
            "steps": [step.as_dict() for step in self.steps],
        }


def workflow_status(bind: Bind, queue: Queue, workflow_id: int) -> WorkflowStatus:
    """Workflow ``workflow_id`` of ``queue``'s table (see the module).
    Raises :class:`~sqla_queue.common.exceptions.TaskNotFoundError` when it
    has no such workflow."""
    table = resolve_table(queue)
    with _connection(bind) as conn:
        queries = _adapter(conn, table).workflow_view
        steps = queries.steps_of(conn, workflow_id=workflow_id)
        if not steps:
            raise TaskNotFoundError(f"no workflow {workflow_id} in {_table_name(table)}")
        edges = queries.edges_of(conn, workflow_id=workflow_id)
        family: dict[int, dict[int, Any]] = {int(step.step_id): {} for step in steps}
        for row in queries.rows_of(conn, workflow_id=workflow_id):
            family[int(row.step)][int(row.id)] = row
        _follow_requeues(family, lambda heads: queries.rows_linked(conn, heads=heads))
    parents: dict[int, list[int]] = {}
    for child, parent, _ in edges:
        parents.setdefault(int(child), []).append(int(parent))
    depth = _depths(list(family), parents)
    shown = [
        _step(step, family[int(step.step_id)], parents.get(int(step.step_id), []), depth)
        for step in steps
    ]
    return WorkflowStatus(
        workflow=workflow_id,
        state=_workflow_state(shown),
        on_failure=str(steps[0].on_failure),
        queue=_table_name(table),
        steps=shown,
    )


def workflow_of(bind: Bind, queue: Queue, step_id: int) -> int | None:
    """The workflow whose step ``step_id`` is (a task's first attempt: its
    ``Timeline.chain_id``), None for a task that is no workflow's step."""
    table = resolve_table(queue)
    with _connection(bind) as conn:
        return _adapter(conn, table).workflow_view.workflow_of(conn, step_id=step_id)


# ---------------------------------------------------------------- states


def _requeued_head(row: Any) -> bool:
    """A requeued chain's first row (a dead-letter run's is ``dead``)."""
    return not row.dead and row.id_inicial is None and row.live_id is not None


def _follow_requeues(
    family: dict[int, dict[int, Any]], linked: Callable[[list[int]], Iterable[Any]]
) -> None:
    """Add to each step's rows those that name one of its requeued chains
    as ``live_id``: that chain's own dead-letter run, and the chain
    requeued from it, and so on (``linked``: the rows naming the heads)."""
    owner = {
        int(row.id): step
        for step, rows in family.items()
        for row in rows.values()
        if _requeued_head(row)
    }
    seen: set[int] = set()
    for _ in range(MAX_REQUEUES_FOLLOWED):
        heads = {head: step for head, step in owner.items() if head not in seen}
        if not heads:
            return
        seen.update(heads)
        for row in linked(sorted(heads)):
            step = heads[int(row.step)]
            family[step][int(row.id)] = row
            if _requeued_head(row):
                owner[int(row.id)] = step


def _step(step: Any, rows: dict[int, Any], parents: list[int], depth: dict[int, int]) -> StepStatus:
    step_id = int(step.step_id)
    state, task_state, newest = _step_state(rows)
    if newest is None and step.state == STEP_CANCELLED:
        state = "cancelled"
    first = rows.get(step_id) or (rows[min(rows)] if rows else None)
    return StepStatus(
        id=step_id,
        state=state,
        process=None if first is None else first.processo,
        parents=tuple(parents),
        depth=depth.get(step_id, 0),
        task_id=None if newest is None else int(newest.id),
        attempt=None if newest is None else int(newest.tentativa or 1),
        task_state=task_state,
        result=_decoded(step.result),
        compensation=step.state == STEP_COMPENSATION,
    )


def _step_state(rows: dict[int, Any]) -> tuple[str, str | None, Any]:
    """(state, ``status``'s word, the newest row) of a step's rows."""
    if not rows:
        return "purged", None, None
    chains: dict[int, list[Any]] = {}
    for row_id in sorted(rows):
        row = rows[row_id]
        chains.setdefault(int(row.id_inicial or row.id), []).append(row)
    # a dead-letter run comes after the chain that died, and a requeue after it
    chain = chains[max(chains)]
    if chain[0].dead:
        return "dead_letter", "dead_letter", chain[-1]
    newest = next((row for row in reversed(chain) if not row.reenfileirado), chain[-1])
    status, later = newest.status, (newest.tentativa or 1) > 1
    if status == _PENDING:
        return "ready", "retrying" if later else "ready", newest
    if status == _SCHEDULED:
        if newest.data_hora is None:
            return "waiting", "scheduled", newest
        return "ready", "retrying" if later else "scheduled", newest
    if status in _SIMPLE:
        return _SIMPLE[status], _SIMPLE[status], newest
    if status in _FAILED:
        state = "cancelled" if newest.cancelled else "failed"
        return state, state, newest
    return "unknown", None, newest


def _workflow_state(steps: Sequence[StepStatus]) -> str:
    found = {step.state for step in steps if not step.compensation}
    for state in ("running", "ready"):
        if state in found:
            return "running"
    for state in ("dead_letter", "failed", "cancelled", "waiting"):
        if state in found:
            return state
    if found == {"succeeded"}:
        return "succeeded"
    return "purged" if "purged" in found else "unknown"


def _depths(steps: list[int], parents: dict[int, list[int]]) -> dict[int, int]:
    """Each step's longest way from a step without parents (edges to a
    step outside ``steps`` are left out)."""
    known = set(steps)
    children: dict[int, list[int]] = {}
    waiting = {step: 0 for step in steps}
    for child, of in parents.items():
        for parent in of:
            if parent in known and child in known:
                children.setdefault(parent, []).append(child)
                waiting[child] += 1
    depth = dict.fromkeys(steps, 0)
    todo = [step for step in steps if not waiting[step]]
    while todo:
        step = todo.pop()
        for child in children.get(step, ()):
            depth[child] = max(depth[child], depth[step] + 1)
            waiting[child] -= 1
            if not waiting[child]:
                todo.append(child)
    return depth


def _decoded(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:  # not written by sqla-queue: shown as stored
        return text


# ---------------------------------------------------------------- the graph

#: a step's box and the room around it (px)
BOX_WIDTH, BOX_HEIGHT, GAP_X, GAP_Y, MARGIN, LINE = 170, 40, 60, 12, 16, 15
#: (fill, stroke) of a box per state
COLOURS = {
    "waiting": ("#f3f4f6", "#9ca3af"),
    "ready": ("#dbeafe", "#2563eb"),
    "running": ("#fef3c7", "#d97706"),
    "succeeded": ("#dcfce7", "#16a34a"),
    "failed": ("#fee2e2", "#dc2626"),
    "cancelled": ("#e5e7eb", "#4b5563"),
    "dead_letter": ("#fca5a5", "#7f1d1d"),
}
_OTHER = ("#ffffff", "#9ca3af")
#: characters of a process name shown in a box (the whole name in its tooltip)
_PROCESS_SHOWN = 22
# what XML 1.0 refuses and escape_controls leaves
_NOT_XML = re.compile("[\ufffe\uffff]")


@dataclass
class _Box:
    steps: list[StepStatus]
    collapsed: bool
    x: int = 0
    y: int = 0
    height: int = BOX_HEIGHT


def workflow_svg(status: WorkflowStatus, *, href: Callable[[int], str] | None = None) -> str:
    """The workflow's graph as an SVG document (see the module); ``href``:
    the link of a step's box (the dashboard's task page), none without."""
    boxes, width, height = _layout(status.steps)
    where = {step.id: box for laid in boxes for box in laid for step in box.steps}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="workflow-graph" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="12" role="img" '
        f'data-workflow="{status.workflow}">',
        f"<title>{_xml(f'workflow {status.workflow}: {status.state}')}</title>",
        '<defs><marker id="wf-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#6b7280"/></marker></defs>',
    ]
    drawn: set[tuple[int, int]] = set()
    for step in status.steps:
        for parent in step.parents:
            start, end = where.get(parent), where.get(step.id)
            if start is None or end is None or start is end:
                continue
            if (id(start), id(end)) in drawn:
                continue
            drawn.add((id(start), id(end)))
            parts.append(
                f'<line class="edge" x1="{start.x + BOX_WIDTH}" y1="{start.y + start.height // 2}" '
                f'x2="{end.x}" y2="{end.y + end.height // 2}" stroke="#6b7280" '
                f'stroke-width="1.2" marker-end="url(#wf-arrow)"/>'
            )
    for laid in boxes:
        for box in laid:
            parts.append(_collapsed(box) if box.collapsed else _box(box, href))
    parts.append("</svg>")
    return "\n".join(parts)


def _layout(steps: Sequence[StepStatus]) -> tuple[list[list[_Box]], int, int]:
    """The boxes by column, placed (each column centred on the tallest),
    and the drawing's width and height."""
    boxes: list[list[_Box]] = []
    for column in _columns(steps):
        if len(column) > COLLAPSE_OVER or len({step.depth for step in column}) > 1:
            states = len({step.state for step in column})
            boxes.append([_Box(column, True, height=BOX_HEIGHT + LINE * states)])
        else:
            boxes.append([_Box([step], False) for step in column])
    heights = [sum(box.height for box in laid) + GAP_Y * (len(laid) - 1) for laid in boxes]
    tallest = max(heights, default=BOX_HEIGHT)
    for k, laid in enumerate(boxes):
        y = MARGIN + (tallest - heights[k]) // 2
        for box in laid:
            box.x, box.y = MARGIN + k * (BOX_WIDTH + GAP_X), y
            y += box.height + GAP_Y
    width = 2 * MARGIN + len(boxes) * BOX_WIDTH + max(0, len(boxes) - 1) * GAP_X
    return boxes, width, 2 * MARGIN + tallest


def _columns(steps: Sequence[StepStatus]) -> list[list[StepStatus]]:
    """The steps by depth; consecutive depths share a column when there
    are more than :data:`MAX_COLUMNS`."""
    depths = max((step.depth for step in steps), default=0) + 1
    per = math.ceil(depths / MAX_COLUMNS)
    columns: list[list[StepStatus]] = [[] for _ in range(math.ceil(depths / per))]
    for step in sorted(steps, key=lambda step: (step.depth, step.id)):
        columns[step.depth // per].append(step)
    return [column for column in columns if column]


def _box(box: _Box, href: Callable[[int], str] | None) -> str:
    step = box.steps[0]
    fill, stroke = COLOURS.get(step.state, _OTHER)
    process = step.process or "(none)"
    short = process if len(process) <= _PROCESS_SHOWN else process[: _PROCESS_SHOWN - 1] + "…"
    tip = f"step {step.id} ({process}): {step.label}; parents: {step.parents_shown()}"
    dashed = ' stroke-dasharray="4 3"' if step.state in ("waiting", "cancelled") else ""
    inner = (
        f"<title>{_xml(tip)}</title>"
        f'<rect x="{box.x}" y="{box.y}" width="{BOX_WIDTH}" height="{box.height}" rx="5" '
        f'fill="{fill}" stroke="{stroke}"{dashed}/>'
        f'<text x="{box.x + 8}" y="{box.y + 16}" font-weight="bold">'
        f"{_xml(f'{step.id} · {step.state}')}</text>"
        f'<text x="{box.x + 8}" y="{box.y + 32}">{_xml(short)}</text>'
    )
    if href is not None:
        inner = f'<a href="{_xml(href(step.id))}">{inner}</a>'
    return f'<g class="step" data-step="{step.id}" data-state="{_xml(step.state)}">{inner}</g>'


def _collapsed(box: _Box) -> str:
    counts = Counter(step.state for step in box.steps)
    order = [state for state in STEP_STATES if counts[state]]
    order += sorted(set(counts) - set(order))
    total = len(box.steps)
    said = ", ".join(f"{counts[state]} {state}" for state in order)
    low, high = box.steps[0].depth, box.steps[-1].depth
    where = f"depth {low}" if low == high else f"depths {low} to {high}"
    lines = [
        f"<title>{_xml(f'{total} steps ({where}): {said}')}</title>",
        f'<rect x="{box.x}" y="{box.y}" width="{BOX_WIDTH}" height="{box.height}" rx="5" '
        f'fill="#f9fafb" stroke="#374151" stroke-width="1.5"/>',
        f'<text x="{box.x + 8}" y="{box.y + 17}" font-weight="bold">{total:,} steps:</text>',
    ]
    for k, state in enumerate(order):
        fill, stroke = COLOURS.get(state, _OTHER)
        y = box.y + 26 + k * LINE
        lines.append(
            f'<rect x="{box.x + 8}" y="{y}" width="10" height="10" '
            f'fill="{fill}" stroke="{stroke}"/>'
            f'<text x="{box.x + 24}" y="{y + 9}">{counts[state]:,} {_xml(state)}</text>'
        )
    return f'<g class="collapsed" data-steps="{total}">{"".join(lines)}</g>'


def _xml(text: str) -> str:
    """``text`` as XML character data or an attribute's value: markup
    escaped, control and invisible characters as visible escapes (XML 1.0
    has no way to write most of them)."""
    return escape(_NOT_XML.sub("\N{REPLACEMENT CHARACTER}", escape_controls(text)), quote=True)
