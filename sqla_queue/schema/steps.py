"""``task.after(*parents)``: what it checks and keeps on a task
(docs/workflows.md, "Arbitrary DAGs").

A queue model's method (``QueueMixin.after``) cannot import the client's
``chain`` and ``group`` (``client/workflow.py``, a layer above), so both
share :class:`Steps`, their base, from here; the enqueue reads what
``after()`` kept (:data:`AFTER`) when it walks a workflow.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import inspect

from ..common.exceptions import InvalidTaskError

__all__ = ["AFTER", "Steps", "add_parents", "named", "tasks_of"]

#: the key of a task's after() parents in its ``__dict__`` (where the
#: payload's placeholder is kept too: a SQLModel model takes no attribute
#: that is not a field)
AFTER = "_sqla_queue_after"


class Steps:
    """A chain or a group (``client.workflow.Workflow``): its ``kind`` and
    its ``steps``, tasks, chains and groups."""

    kind: str
    steps: tuple[Any, ...]


def add_parents(task: Any, parents: Sequence[Any], task_type: type) -> None:
    """``task.after(*parents)``: each parent checked (a ``task_type``
    instance, or :class:`Steps`), one line for what is wrong, then kept on
    the task for the enqueue."""
    if not parents:
        raise InvalidTaskError("after() needs a parent: a task, a chain or a group")
    if inspect(task).key is not None:
        raise InvalidTaskError(f"after() is for a new task, not a saved one: {named(task)}")
    table = type(task).__table__
    for parent in parents:
        if not isinstance(parent, (task_type, Steps)):
            raise InvalidTaskError(
                "a task runs after tasks of a queue model, chains or groups, "
                f"not {type(parent).__name__}"
            )
        for member in tasks_of(parent):
            if member is task:
                raise InvalidTaskError(
                    f"a task cannot run after itself, nor after a chain or group it is in: {task!r}"
                )
            if inspect(member).key is not None:
                raise InvalidTaskError(
                    f"a task runs after new tasks, not saved ones: {named(member)}"
                )
            if type(member).__table__ is not table:
                raise InvalidTaskError(
                    f"a task runs after tasks of its own queue table {table.name}, "
                    f"not of {type(member).__table__.name}: {member!r}"
                )
    task.__dict__.setdefault(AFTER, []).extend(parents)


def tasks_of(step: Any) -> Iterator[Any]:
    """The tasks a chain or group names (not their after() parents); a
    task's own self."""
    if isinstance(step, Steps):
        for inner in step.steps:
            yield from tasks_of(inner)
    else:
        yield step


def named(task: Any) -> str:
    """A saved task by its id (its other attributes may be expired, and a
    detached task cannot load them), a new one by its repr."""
    identity = inspect(task).identity
    if identity is None:
        return repr(task)
    return f"task {identity[0]} of {type(task).__table__.name}"
