"""Task semantics: claim, run, complete, fail into a retry or a dead letter.

The manager owns the lifecycle of the seed (see ``docs/lifecycle.md``); it
asks its adapter for every database operation and never writes SQL itself.

A batch runs in **one transaction on the work connection**. Each handler gets
its own ORM Session on that transaction in ``create_savepoint`` mode: the
Session opens a SAVEPOINT the first time it touches the database, so a
failing handler's writes roll back alone, and a handler that never touches
the database costs no round trip at all. The ``sucesso`` rows of the batch
are written by one statement and commit together with the handlers' work,
so a committed ``sucesso`` always means the work committed too. With
``batch_size=1`` this is the classic one-task-per-transaction mode.

Every write to a claimed task is guarded by the claim (``processando`` for
this worker, see ``leases.py``): a batch whose ``sucesso`` update does not
match all its rows lost a task to the rescue, and rolls back whole. A
connection lost while a handler runs ends the batch: the running task's
attempt is consumed (a task that kills its connection every time reaches the
dead letter), the others go back to ``pendente``, on a fresh connection, and
the lane reconnects. Where even that fails (the database is down), the
leases run out and the rescue does the same later.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from .adapters import Adapter, ErrorKind
from .hooks import (
    BATCH_COMMITTED,
    TASK_DEAD,
    TASK_EVENTS,
    TASK_FAILED,
    TASK_HANDED_BACK,
    TASK_RESCUED,
    TASK_RETRIED,
    TASK_SUCCEEDED,
    BatchEvent,
    Hooks,
    TaskEvent,
)
from .logs import task_fields
from .mixins import MESSAGE_MAX_LENGTH, TRACEBACK_MAX_LENGTH, Status
from .pipeline import BatchStage, Handler, Middleware, compose
from .records import TaskRecord
from .redaction import describe_error, fit_message, redact
from .retry import LinearBackoff, RetryPolicy
from .rows import (
    EXHAUSTED_SUFFIX,
    NO_RETRY_SUFFIX,
    RESCUED_ERROR,
    RETRY_SUFFIX,
    carried_columns,
    dead_letter_row,
    failure_message,
    retry_row,
)
from .timelimit import TimeLimitExceeded
from .types import utcnow

if TYPE_CHECKING:
    from .leases import Claims, LeasePolicy
    from .limits import LimitedClaims

__all__ = [
    "BatchResult",
    "ClaimLost",
    "ConnectionLost",
    "Handler",
    "TaskManager",
    "carried_columns",
    "dead_letter_row",
]

logger = logging.getLogger("sqla_queue.manager")


class ConnectionLost(Exception):
    """The work connection died under a batch; the lane must reconnect."""


class ClaimLost(Exception):
    """A batch's guarded ``sucesso`` update missed rows: another worker
    rescued some of its tasks. The batch rolls back."""


def task_label(task: TaskRecord) -> str:
    """How log lines name an attempt: its id, its chain's first id, its
    attempt number and its process; an attempt of a dead-letter run says so
    (its row is stored as ``sucesso`` or ``falha`` like any other, with
    ``dead`` true: a log line must not read as the task's success)."""
    kind = "dead-letter run task" if task.dead else "task"
    return f"{kind} {task.id} (chain {task.chain_id}, attempt {task.attempt}, {task.process})"


def describe_traceback(exc: BaseException) -> str:
    """The frames of ``exc``'s traceback and its one-line description, with
    no exception text from inside it (a database error's text holds SQL and
    parameters)."""
    frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
    return f"Traceback (most recent call last):\n{frames}{describe_error(exc)}"


def _kept_end(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its end (the frames
    nearest the error, and the error itself)."""
    if len(text) <= limit:
        return text
    return "…" + text[len(text) - limit + 1 :]


@dataclass
class BatchResult:
    succeeded: int = 0
    failed: int = 0
    handed_back: list[int] = field(default_factory=list)
    seconds: float = 0.0


class ClaimSource(Protocol):
    """What claims a batch, in transactions of its own on ``conn``: an
    adapter's claim (:class:`PlainClaims`) or a claim built on adapters'
    (fairness.py)."""

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]: ...

    @property
    def capped(self) -> bool:
        """The calling lane's last claim stopped at a limit with tasks left
        ready: claim again after the batch, as after a full one."""
        ...

    @property
    def retry_in(self) -> float | None:
        """Seconds until a rate limit that cut the calling lane's last claim
        short has a token again; None: none did."""
        ...


class PlainClaims:
    """An adapter's claim, in one transaction."""

    capped = False  # no limit of its own
    retry_in = None

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter

    def claim(
        self, conn: Connection, *, limit: int, owner: str, lease_seconds: float
    ) -> list[TaskRecord]:
        with conn.begin():
            return self.adapter.task_claim_many(
                conn, limit=limit, owner=owner, lease_seconds=lease_seconds
            )


class TaskManager:
    def __init__(
        self,
        adapter: Adapter,
        backoff: RetryPolicy | None = None,
        *,
        claims: Claims,
        lease: LeasePolicy,
        stages: Sequence[BatchStage] = (),
        middleware: Sequence[Middleware] = (),
        no_retry: tuple[type[BaseException], ...] = (),
        lease_for: Callable[[TaskRecord], float] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.adapter = adapter
        #: exceptions that send a task straight to its dead-letter run
        self.no_retry = no_retry
        #: a task's own lease, where the worker gives tasks different ones
        self.lease_for = lease_for
        #: the batch stages (pipeline.py): the pub/sub fan-out runs claimed
        #: publications instead of the handler, the webhook delivery makes a
        #: batch's calls before its transaction and answers for those copies
        self.stages = tuple(stages)
        #: what runs around every handler (pipeline.py): the time limits
        self.middleware = tuple(middleware)
        #: the observers of outcomes, called after each commit (hooks.py)
        self.hooks = hooks or Hooks()
        #: claims through this instead: an adapter whose claim skips paused
        #: processes (the same table and locks: pause.py), a fair claim
        #: by key (fairness.py), or both
        self.claim_source: ClaimSource = PlainClaims(adapter)
        #: the claims of processes with a fleet-wide concurrency limit
        #: (limits.py), made before the others, which leave them out
        self.limited: LimitedClaims | None = None
        self.backoff: RetryPolicy = backoff or LinearBackoff()
        self.claims = claims
        self.owner = claims.owner
        self.lease = lease

    # ----------------------------------------------------------- claiming
    def claim(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        tasks: list[TaskRecord] = []
        if self.limited is not None:
            tasks = self.limited.claim(
                conn, limit=limit, owner=self.owner, lease_seconds=self.lease.seconds
            )
        if len(tasks) < limit:
            tasks += self.claim_source.claim(
                conn, limit=limit - len(tasks), owner=self.owner, lease_seconds=self.lease.seconds
            )
        self.claims.add(task.id for task in tasks)
        if self.lease_for is not None and tasks:
            self._own_leases(conn, tasks)
        return tasks

    @property
    def claim_retry_in(self) -> float | None:
        """Seconds until a rate limit (a process's: limits.py; a key's:
        fairness.py) that cut the last claim short has a token again;
        None: none did."""
        waits = [self.claim_source.retry_in]
        if self.limited is not None:
            waits.append(self.limited.retry_in)
        found = [wait for wait in waits if wait is not None]
        return min(found) if found else None

    @property
    def claim_capped(self) -> bool:
        """The last claim stopped at a concurrency limit with slots of its
        own (limits.py): claim again after the batch, as after a full one."""
        return (self.limited is not None and self.limited.capped) or self.claim_source.capped

    def _own_leases(self, conn: Connection, tasks: Sequence[TaskRecord]) -> None:
        """Give the tasks whose lease differs from the worker's their own,
        now and at every heartbeat."""
        assert self.lease_for is not None
        by_lease: dict[float, list[int]] = {}
        for task in tasks:
            seconds = self.lease_for(task)
            if seconds != self.lease.seconds:
                by_lease.setdefault(seconds, []).append(task.id)
        for seconds, ids in by_lease.items():
            self.claims.set_lease(ids, seconds)
            with conn.begin():
                self.adapter.task_lease_renew(
                    conn, ids=ids, owner=self.owner, lease_seconds=seconds
                )

    def promote_due(self, conn: Connection) -> int:
        with conn.begin():
            return self.adapter.task_promote_due(conn)

    def next_due(self, conn: Connection) -> Any:
        with conn.begin():
            return self.adapter.task_next_due(conn)

    # ----------------------------------------------------------- running
    def run_batch(
        self,
        claim_conn: Connection,
        work_conn: Connection,
        tasks: Sequence[TaskRecord],
        handler: Handler,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> BatchResult:
        """Run claimed ``tasks`` in one transaction and record every outcome.

        When ``should_stop()`` turns true, the tasks not yet started go back
        to ``pendente`` in the same commit. A batch whose webhook calls were
        made (before its transaction: see ``stage``) records every outcome
        instead: a call made is never handed back to be made again."""
        started = time.perf_counter()
        ids = [task.id for task in tasks]
        called = False
        handler = compose(handler, work_conn, self.stages, self.middleware)
        try:
            # every stage prepares, even after one made calls
            if any([stage.prepare(work_conn, tasks) for stage in self.stages]):
                called, should_stop = True, _never
            try:
                result = self._run_together(work_conn, tasks, handler, should_stop)
            except ClaimLost:
                if called and len(tasks) > 1:
                    # record the outcomes of the tasks still ours, one by one
                    result = self._run_alone(work_conn, tasks, handler, should_stop, None)
                else:
                    # nothing of the batch committed; the tasks still ours run again
                    self._hand_back_after_rollback(work_conn, ids)
                    result = BatchResult(handed_back=ids)
            except DBAPIError as exc:
                if self._retryable(exc):
                    raise
                # the batch failed as a whole, after its handlers returned (a
                # deferred constraint at COMMIT, say): find the task at fault
                result = self._run_alone(work_conn, tasks, handler, should_stop, exc)
        except ConnectionLost as lost:
            culprit = lost.args[0] if lost.args else None
            self._recover_after_lost_connection(work_conn, tasks, culprit, lost.__cause__)
            raise
        except BaseException:
            # nothing of the batch committed (a deadlock, a lost connection),
            # and the fault is not its tasks': they are ready to run again
            self._hand_back_after_rollback(work_conn, ids)
            raise
        finally:
            # after the commit (or the rollback), never before: another worker
            # must not claim a task whose outcome is not yet committed
            self.claims.discard(ids)
            self._release(claim_conn, ids)
            for stage in self.stages:
                stage.forget(ids)
        if result.handed_back and self.adapter.supports_notify:
            with claim_conn.begin():
                self.adapter.notify(claim_conn)
        result.seconds = time.perf_counter() - started
        if self.hooks.wanted(BATCH_COMMITTED):
            self.hooks.emit(
                [
                    BatchEvent(
                        BATCH_COMMITTED,
                        tasks=len(tasks),
                        succeeded=result.succeeded,
                        failed=result.failed,
                        handed_back=len(result.handed_back),
                        seconds=result.seconds,
                    )
                ]
            )
        return result

    def run_here(
        self, conn: Connection, tasks: Sequence[TaskRecord], handler: Handler
    ) -> list[str | None]:
        """Run claimed ``tasks`` in the caller's open transaction on ``conn``
        (``sqla_queue.testing``): each in a savepoint, through the stages and
        middleware, every outcome recorded (``sucesso``, a failure with its
        retry or dead-letter run), nothing committed. No stage's work outside
        a transaction is done (no webhook call). The hooks' event of each
        task's outcome, in order (None: a failure not recorded)."""
        handler = compose(handler, conn, self.stages, self.middleware)
        outcomes: list[str | None] = []
        done: list[tuple[int, str | None]] = []
        for task in tasks:
            message = self._run_one(conn, task, handler)
            if isinstance(message, _Failed):
                outcomes.append(message.event)
            else:
                done.append((task.id, message))
                outcomes.append(TASK_SUCCEEDED)
        self.adapter.task_complete_many(conn, results=done, owner=self.owner)
        return outcomes

    def _retryable(self, exc: DBAPIError) -> bool:
        """A failure that is nobody's task's fault: the connection is gone,
        or the database asks for the transaction to be tried again."""
        return bool(exc.connection_invalidated) or (
            self.adapter.classify(exc) is ErrorKind.TRANSIENT
        )

    def _run_together(
        self,
        work_conn: Connection,
        tasks: Sequence[TaskRecord],
        handler: Handler,
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        result = BatchResult()
        # the outcomes' events, built only when observed, emitted after COMMIT
        events: list[TaskEvent] | None = [] if self.hooks.wanted(*TASK_EVENTS) else None
        with work_conn.begin():
            done: list[tuple[int, str | None]] = []
            for index, task in enumerate(tasks):
                if index and should_stop():
                    result.handed_back = [t.id for t in tasks[index:]]
                    break
                started = time.perf_counter() if events is not None else 0.0
                message = self._run_one(work_conn, task, handler)
                event: str | None
                if isinstance(message, _Failed):
                    result.failed += 1
                    event, text = message.event, message.text
                else:
                    done.append((task.id, message))
                    event, text = TASK_SUCCEEDED, message
                if events is not None and event is not None:
                    events.append(TaskEvent(event, task, text, time.perf_counter() - started))
            # the batch's own transaction: it commits next, with nothing
            # else to write when the batch is one task (no hand-back then)
            completed = self.adapter.task_complete_many(
                work_conn, results=done, owner=self.owner, commits=len(tasks) == 1
            )
            if completed != len(done):
                logger.warning(
                    "%d of %d finished task(s) are no longer claimed by this worker "
                    "(rescued after its lease or lock was lost): the batch rolls back",
                    len(done) - completed,
                    len(done),
                )
                raise ClaimLost()
            self.adapter.task_hand_back_many(work_conn, ids=result.handed_back, owner=self.owner)
            result.succeeded = len(done)
        if events is not None:
            handed_back = set(result.handed_back)
            events += [TaskEvent(TASK_HANDED_BACK, t) for t in tasks if t.id in handed_back]
            self.hooks.emit(events)
        return result

    def _run_alone(
        self,
        work_conn: Connection,
        tasks: Sequence[TaskRecord],
        handler: Handler,
        should_stop: Callable[[], bool],
        error: DBAPIError | None,
    ) -> BatchResult:
        """Run each task of a batch that failed as a whole in a transaction
        of its own; the one whose commit fails again gets the failure (a
        retry or its dead-letter run), as a handler's exception would.
        A single task is not run again: its failure (``error``) is known
        already; with ``error`` None (a batch that lost a claim) it is."""
        result = BatchResult()
        for index, task in enumerate(tasks):
            if index and should_stop():
                result.handed_back = [t.id for t in tasks[index:]]
                with work_conn.begin():
                    self.adapter.task_hand_back_many(
                        work_conn, ids=result.handed_back, owner=self.owner
                    )
                break
            if len(tasks) > 1 or error is None:
                try:
                    one = self._run_together(work_conn, [task], handler, _never)
                except ClaimLost:
                    continue  # rescued meanwhile: another worker has it now
                except DBAPIError as exc:
                    if self._retryable(exc):
                        raise
                    error = exc
                else:
                    result.succeeded += one.succeeded
                    result.failed += one.failed
                    continue
            assert error is not None  # set by the failed run above
            message = describe_error(error)
            with work_conn.begin():
                recorded = self.record_failure(work_conn, task, message)
            result.failed += 1
            if recorded:
                self.hooks.emit([TaskEvent(recorded, task, message)])
                logger.warning(
                    "%s failed at commit: %s",
                    task_label(task),
                    fit_message(message, MESSAGE_MAX_LENGTH),
                    extra=task_fields(task),
                )
        return result

    def _run_one(self, conn: Connection, task: TaskRecord, handler: Handler) -> Any:
        started = time.perf_counter()
        session = Session(
            bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        try:
            returned = handler(task, session)
            if _touched(session):
                session.commit()  # flush, then RELEASE the savepoint
        except Exception as exc:
            if _connection_lost(conn, exc):
                _close_quietly(session)
                raise ConnectionLost(task) from exc
            try:
                session.rollback()
            except SQLAlchemyError as rollback_error:
                if _connection_lost(conn, rollback_error):
                    _close_quietly(session)
                    raise ConnectionLost(task) from exc
                raise
            error = describe_error(exc)
            retry = not isinstance(exc, self.no_retry)
            frames = redact(describe_traceback(exc))
            recorded = self.record_failure(
                conn, task, error, retry=retry, trace=_kept_end(frames, TRACEBACK_MAX_LENGTH)
            )
            if recorded:
                logger.warning(
                    "%s failed: %s%s",
                    task_label(task),
                    fit_message(error, MESSAGE_MAX_LENGTH),
                    # an expected failure (a webhook's answer) needs no frames
                    "\n" + frames if getattr(exc, "log_traceback", True) else "",
                    extra=task_fields(task, time.perf_counter() - started),
                )
            return _Failed(recorded, error)
        finally:
            if _touched(session) or session.identity_map:
                session.close()
        if logger.isEnabledFor(logging.INFO):
            seconds = time.perf_counter() - started
            logger.info(
                "%s %s in %.1f ms",
                task_label(task),
                # a dead-letter run's handler returned: the task itself did not succeed
                "done" if task.dead else "succeeded",
                seconds * 1000,
                extra=task_fields(task, seconds),
            )
        return None if returned is None else fit_message(str(returned), MESSAGE_MAX_LENGTH)

    def _hand_back_after_rollback(self, conn: Connection, ids: list[int]) -> None:
        """Hand back this worker's claimed ``ids`` on a fresh connection (the
        batch's may be dead); guarded, so tasks that did commit stay as they are."""
        try:
            with conn.engine.connect() as fresh, fresh.begin():
                self.adapter.task_hand_back_many(fresh, ids=ids, owner=self.owner)
        except Exception as exc:  # their leases run out; the rescue retries them
            logger.warning("could not hand back tasks %s: %s", ids, describe_error(exc))

    def _recover_after_lost_connection(
        self,
        conn: Connection,
        tasks: Sequence[TaskRecord],
        culprit: TaskRecord | None,
        cause: BaseException | None,
    ) -> None:
        """The batch died with its connection: the running task's attempt is
        consumed (a failure and its retry or dead letter), the others go back
        to ``pendente``. All guarded by the claim, on a fresh connection."""
        error = "connection to the database lost while the task ran"
        if isinstance(cause, TimeLimitExceeded):  # abandoned with its connection
            error = describe_error(cause)
        elif cause is not None:
            error = f"{error}: {describe_error(cause)}"
        others = [task.id for task in tasks if task is not culprit]
        recorded = None
        try:
            with conn.engine.connect() as fresh, fresh.begin():
                if culprit is not None:
                    recorded = self.record_failure(fresh, culprit, error)
                self.adapter.task_hand_back_many(fresh, ids=others, owner=self.owner)
        except Exception as exc:  # the database is away: the leases run out instead
            logger.warning(
                "could not record the lost batch (%s); the rescue will", describe_error(exc)
            )
            return
        if culprit is not None:
            logger.warning(
                "%s failed: %s",
                task_label(culprit),
                fit_message(error, 500),
                extra=task_fields(culprit),
            )
            if recorded:
                self.hooks.emit([TaskEvent(recorded, culprit, error)])

    def _release(self, claim_conn: Connection, ids: list[int]) -> None:
        if not ids or not self.adapter.task_locks:
            return
        try:
            with claim_conn.begin():
                self.adapter.lock_release_many(claim_conn, ids=ids)
        except Exception as exc:  # the connection is gone, and its locks with it
            logger.warning("could not release task locks: %s", describe_error(exc))
            claim_conn.invalidate()

    # ----------------------------------------------------------- failures
    def record_failure(
        self,
        conn: Connection,
        task: TaskRecord,
        error: str,
        *,
        rescued: bool = False,
        retry: bool = True,
        trace: str | None = None,
    ) -> str | None:
        """Mark the attempt failed and enqueue what follows it: the next
        attempt, or, past the maximum (or with ``retry`` false: an error
        not worth retrying), a dead-letter run. Guarded by the claim (this
        worker's, or for the rescue the lease it found expired): None, and
        nothing written, when the task is no longer that claim's; else the
        hooks' event of what was written (``task_retried``, ``task_dead``,
        ``task_failed`` for a dead-letter run that failed). ``trace``:
        the failed attempt's ``error_traceback``."""
        now = utcnow()
        failed_status = (Status.FAILED_PROCESSING if rescued else Status.FAILED).value
        next_at = self.backoff.next_attempt_at(task.attempt, now) if retry else None
        if next_at is not None:
            message = failure_message(error, RETRY_SUFFIX)
            values = {
                "status": failed_status,
                "reenfileirado": True,
                "mensagem": message,
                "proxima_tentativa": next_at,
                "finished_at": self.adapter.clock(),
                "error_traceback": trace,
            }
            if not self._update_claimed(conn, task, values, rescued=rescued):
                return None
            self.adapter.task_insert_many(
                conn, rows=[retry_row(task, next_at, failed_status, message, now)]
            )
            return TASK_RETRIED
        suffix = EXHAUSTED_SUFFIX if retry else NO_RETRY_SUFFIX
        message = failure_message(error, suffix)
        values = {
            "status": failed_status,
            "estouro_tentativas": True,
            "mensagem": message,
            "finished_at": self.adapter.clock(),
            "error_traceback": trace,
        }
        if not self._update_claimed(conn, task, values, rescued=rescued):
            return None
        if task.dead:
            # the reference starts another dead run here, forever; we stop
            logger.error(
                "%s exhausted its attempts; it stays %s",
                task_label(task),
                failed_status,
                extra=task_fields(task),
            )
            return TASK_FAILED
        self.adapter.task_insert_many(conn, rows=[dead_letter_row(task)])
        logger.warning(
            "%s exhausted its attempts: dead-letter run enqueued",
            task_label(task),
            extra=task_fields(task),
        )
        return TASK_DEAD

    def _update_claimed(
        self, conn: Connection, task: TaskRecord, values: dict[str, Any], *, rescued: bool
    ) -> bool:
        if rescued:
            # the claim the rescue judged lost, unchanged since it looked
            return self.adapter.task_update_claimed(
                conn,
                task_id=task.id,
                values=values,
                owner=task.worker_id,
                lease_expires_at=task.lease_expires_at,
            )
        return self.adapter.task_update_claimed(
            conn, task_id=task.id, values=values, owner=self.owner
        )

    # ----------------------------------------------------------- rescue
    def rescue(self, conn: Connection, *, limit: int = 100) -> int:
        """Re-enqueue tasks whose claim is lost (lease expired, or the
        worker's per-task lock died): ``falha_processando`` + a retry, as
        the seed's retry thread does. One transaction; the rows are locked
        (or, without row locks, updated only if their lease is unchanged),
        so two rescuers, or a rescuer and a late heartbeat, never both win."""
        with conn.begin():
            lost = self.adapter.task_rescue_lost(conn, limit=limit)
            rescued = [
                task
                for task in lost
                if self.record_failure(conn, task, RESCUED_ERROR, rescued=True)
            ]
        if rescued:
            logger.warning(
                "rescued %d task(s) whose worker lost its claim: %s",
                len(rescued),
                ", ".join(task_label(task) for task in rescued),
            )
            self.hooks.emit([TaskEvent(TASK_RESCUED, task, RESCUED_ERROR) for task in rescued])
        return len(rescued)


@dataclass(frozen=True)
class _Failed:
    """What ``_run_one`` returns for a failed task: the event of what its
    failure wrote (hooks.py) and its message."""

    event: str | None  # None: not recorded (the claim was lost meanwhile)
    text: str


def _never() -> bool:
    return False


def _connection_lost(conn: Connection, exc: BaseException) -> bool:
    """Whether ``exc`` left ``conn`` unusable: invalidated by SQLAlchemy (a
    disconnect), or a driver error that says the connection is gone."""
    if conn.invalidated or conn.closed:
        return True
    if isinstance(exc, DBAPIError):
        return bool(exc.connection_invalidated)
    return False


def _close_quietly(session: Session) -> None:
    try:
        session.close()
    except Exception as exc:  # its connection is dead already
        logger.debug("closing a session on a lost connection: %s", describe_error(exc))


def _touched(session: Session) -> bool:
    """Whether a handler used its Session (an untouched one costs nothing)."""
    return bool(session.in_transaction() or session.new or session.dirty or session.deleted)
