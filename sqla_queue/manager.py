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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from .adapters import Adapter
from .mixins import MESSAGE_MAX_LENGTH, Status
from .records import TaskRecord
from .redaction import fit_message
from .retry import LinearBackoff
from .types import utcnow

__all__ = ["BatchResult", "Handler", "TaskManager"]

logger = logging.getLogger("sqla_queue.manager")

RETRY_SUFFIX = ". Tarefa reenfileirada."
EXHAUSTED_SUFFIX = ". Máximo de tentativas atingido."
RESCUED_MESSAGE = (
    "Falha desconhecida de processamento (processamento abortado repentinamente). "
    "Tarefa reenfileirada."
)
RESCUE_LOCK_KEY = 1

Handler = Callable[[TaskRecord, Session], Any]


def describe_error(exc: BaseException) -> str:
    """``Type: text`` of an error, for ``mensagem``. A database error is
    described by the driver's error alone: SQLAlchemy's text adds the SQL and
    its parameters, which may hold anything."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class BatchResult:
    succeeded: int = 0
    failed: int = 0
    handed_back: list[int] = field(default_factory=list)
    seconds: float = 0.0


class TaskManager:
    def __init__(self, adapter: Adapter, backoff: LinearBackoff | None = None) -> None:
        self.adapter = adapter
        self.backoff = backoff or LinearBackoff()

    # ----------------------------------------------------------- claiming
    def claim(self, conn: Connection, *, limit: int) -> list[TaskRecord]:
        with conn.begin():
            return self.adapter.task_claim_many(conn, limit=limit)

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
        to ``pendente`` in the same commit."""
        started = time.perf_counter()
        ids = [task.id for task in tasks]
        try:
            try:
                result = self._run_together(work_conn, tasks, handler, should_stop)
            except DBAPIError as exc:
                if self._retryable(exc):
                    raise
                # the batch failed as a whole, after its handlers returned (a
                # deferred constraint at COMMIT, say): find the task at fault
                result = self._run_alone(work_conn, tasks, handler, should_stop, exc)
        except BaseException:
            # nothing of the batch committed (a deadlock, a lost connection),
            # and the fault is not its tasks': they are ready to run again
            self._hand_back_after_rollback(claim_conn, ids)
            raise
        finally:
            # after the commit (or the rollback), never before: another worker
            # must not claim a task whose outcome is not yet committed
            self._release(claim_conn, ids)
        if result.handed_back and self.adapter.supports_notify:
            with claim_conn.begin():
                self.adapter.notify(claim_conn)
        result.seconds = time.perf_counter() - started
        return result

    def _retryable(self, exc: DBAPIError) -> bool:
        """A failure that is nobody's task's fault: the connection is gone,
        or the database asks for the transaction to be tried again."""
        return bool(exc.connection_invalidated) or self.adapter.is_transient(exc)

    def _run_together(
        self,
        work_conn: Connection,
        tasks: Sequence[TaskRecord],
        handler: Handler,
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        result = BatchResult()
        with work_conn.begin():
            done: list[tuple[int, str | None]] = []
            for index, task in enumerate(tasks):
                if index and should_stop():
                    result.handed_back = [t.id for t in tasks[index:]]
                    break
                message = self._run_one(work_conn, task, handler)
                if message is _FAILED:
                    result.failed += 1
                else:
                    done.append((task.id, message))
            self.adapter.task_complete_many(work_conn, results=done)
            self.adapter.task_hand_back_many(work_conn, ids=result.handed_back)
            result.succeeded = len(done)
        return result

    def _run_alone(
        self,
        work_conn: Connection,
        tasks: Sequence[TaskRecord],
        handler: Handler,
        should_stop: Callable[[], bool],
        error: DBAPIError,
    ) -> BatchResult:
        """Run each task of a batch that failed as a whole in a transaction
        of its own; the one whose commit fails again gets the failure (a
        retry or its dead-letter run), as a handler's exception would.
        A single task is not run again: its failure is known already."""
        result = BatchResult()
        for index, task in enumerate(tasks):
            if index and should_stop():
                result.handed_back = [t.id for t in tasks[index:]]
                with work_conn.begin():
                    self.adapter.task_hand_back_many(work_conn, ids=result.handed_back)
                break
            if len(tasks) > 1:
                try:
                    one = self._run_together(work_conn, [task], handler, lambda: False)
                except DBAPIError as exc:
                    if self._retryable(exc):
                        raise
                    error = exc
                else:
                    result.succeeded += one.succeeded
                    result.failed += one.failed
                    continue
            message = describe_error(error)
            with work_conn.begin():
                self.record_failure(work_conn, task, message)
            result.failed += 1
            logger.warning(
                "task %s (%s) attempt %s failed at commit: %s",
                task.id,
                task.process,
                task.attempt,
                fit_message(message, MESSAGE_MAX_LENGTH),
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
            session.rollback()
            error = describe_error(exc)
            self.record_failure(conn, task, error)
            logger.warning(
                "task %s (%s) attempt %s failed: %s",
                task.id,
                task.process,
                task.attempt,
                fit_message(error, MESSAGE_MAX_LENGTH),
            )
            return _FAILED
        finally:
            if _touched(session) or session.identity_map:
                session.close()
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "task %s (%s) attempt %s succeeded in %.1f ms",
                task.id,
                task.process,
                task.attempt,
                (time.perf_counter() - started) * 1000,
            )
        return None if returned is None else fit_message(str(returned), MESSAGE_MAX_LENGTH)

    def _hand_back_after_rollback(self, claim_conn: Connection, ids: list[int]) -> None:
        try:
            with claim_conn.begin():
                self.adapter.task_hand_back_many(claim_conn, ids=ids)
        except Exception as exc:  # the rescue re-enqueues them once the locks are free
            logger.warning("could not hand back tasks %s after a rollback: %s", ids, exc)

    def _release(self, claim_conn: Connection, ids: list[int]) -> None:
        if not ids or not self.adapter.supports_task_locks:
            return
        try:
            with claim_conn.begin():
                self.adapter.lock_release_many(claim_conn, ids=ids)
        except Exception as exc:  # the connection is gone, and its locks with it
            logger.warning("could not release task locks: %s", exc)
            claim_conn.invalidate()

    # ----------------------------------------------------------- failures
    def record_failure(
        self, conn: Connection, task: TaskRecord, error: str, *, rescued: bool = False
    ) -> None:
        """Mark the attempt failed and enqueue what follows it: the next
        attempt, or, past the maximum, a dead-letter run."""
        now = utcnow()
        failed_status = (Status.FAILED_PROCESSING if rescued else Status.FAILED).value
        next_at = self.backoff.next_attempt_at(task.attempt, now)
        if next_at is not None:
            message = (
                RESCUED_MESSAGE if rescued else fit_message(error, MESSAGE_MAX_LENGTH, RETRY_SUFFIX)
            )
            self.adapter.task_update(
                conn,
                task_id=task.id,
                values={
                    "status": failed_status,
                    "reenfileirado": True,
                    "mensagem": message,
                    "proxima_tentativa": next_at,
                },
            )
            self.adapter.task_insert_many(
                conn, rows=[self._retry_row(task, next_at, failed_status, message, now)]
            )
            return
        message = fit_message(error, MESSAGE_MAX_LENGTH, EXHAUSTED_SUFFIX)
        self.adapter.task_update(
            conn,
            task_id=task.id,
            values={
                "status": failed_status,
                "estouro_tentativas": True,
                "mensagem": message,
            },
        )
        if task.dead:
            # the reference starts another dead run here, forever; we stop
            logger.error(
                "dead-letter task %s exhausted its %s attempts; it stays %s",
                task.id,
                task.attempt,
                failed_status,
            )
            return
        self.adapter.task_insert_many(conn, rows=[self._dead_row(task)])
        logger.warning(
            "task %s exhausted its %s attempts: dead-letter run enqueued",
            task.chain_id,
            task.attempt,
        )

    def _retry_row(
        self, task: TaskRecord, next_at: Any, failed_status: str, message: str, now: Any
    ) -> dict[str, Any]:
        return {
            "id_inicial": task.chain_id,
            "data_hora_inicial": task.first_run_at,
            "data_hora": next_at,
            "origem": task.origin,
            "destino": task.destination,
            "processo": task.process,
            "chave_externa": task.external_key,
            "tentativa": task.attempt + 1,
            "status": (Status.SCHEDULED if next_at > now else Status.PENDING).value,
            "id_anterior": task.id,
            "data_hora_anterior": task.run_at,
            "status_anterior": failed_status,
            "mensagem_anterior": message,
            "payload": None,  # the first attempt keeps it
            "tenant": task.tenant,
            "grupo_empresarial": task.company_group,
            "payload_hash": task.payload_hash,
            "pub_sub": task.pub_sub,
            "publication_id": task.publication_id,
            "subscriber_id": task.subscriber_id,
            "dead": task.dead,
            "live_id": task.live_id,
            "prioridade": task.priority,  # the reference reset it to 50
        }

    def _dead_row(self, task: TaskRecord) -> dict[str, Any]:
        return {
            "origem": task.origin,
            "destino": task.destination,
            "processo": task.process,
            "chave_externa": task.external_key,
            "tentativa": 1,
            "status": Status.PENDING.value,
            "payload": task.payload_text,  # the reference lost it on rescued tasks
            "tenant": task.tenant,
            "grupo_empresarial": task.company_group,
            "payload_hash": task.payload_hash,
            "pub_sub": task.pub_sub,
            "publication_id": task.publication_id,
            "subscriber_id": task.subscriber_id,
            "dead": True,
            "live_id": task.chain_id,
            "prioridade": task.priority,
        }

    # ----------------------------------------------------------- rescue
    def rescue(self, claim_conn: Connection, work_conn: Connection, *, limit: int = 100) -> int:
        """Re-enqueue tasks left ``processando`` by a worker that died
        (``falha_processando`` + a retry, as the seed's retry thread does).
        Only one worker rescues a queue at a time."""
        with claim_conn.begin():
            if not self.adapter.lock_try(claim_conn, key=RESCUE_LOCK_KEY):
                return 0
        lost: list[TaskRecord] = []
        try:
            with claim_conn.begin():
                lost = self.adapter.task_rescue_lost(claim_conn, limit=limit)
            if lost:
                with work_conn.begin():
                    for task in lost:
                        self.record_failure(work_conn, task, RESCUED_MESSAGE, rescued=True)
                logger.warning(
                    "rescued %d task(s) left 'processando' by a dead worker: %s",
                    len(lost),
                    [task.id for task in lost],
                )
            return len(lost)
        finally:
            self._release(claim_conn, [task.id for task in lost])
            with claim_conn.begin():
                self.adapter.lock_release(claim_conn, key=RESCUE_LOCK_KEY)


_FAILED: Any = object()


def _touched(session: Session) -> bool:
    """Whether a handler used its Session (an untouched one costs nothing)."""
    return bool(session.in_transaction() or session.new or session.dirty or session.deleted)
