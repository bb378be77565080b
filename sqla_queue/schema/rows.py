"""The rows the queue writes besides the application's, and their messages.

One place for what every writer of the queue table shares: the seed's
message texts (its ``mensagem`` values, kept word for word, as
nsj-queue-lib's workers and dashboards read them) and the builders of the
rows that follow an attempt (a retry, a dead-letter run, a requeued chain).
The manager, the routines, the requeue and the fan-out import them from
here. (The English names of the columns: ``mixins.COLUMN_NAMES``.)
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..common.redaction import fit_message
from .mixins import MESSAGE_MAX_LENGTH, Status
from .records import TaskRecord

__all__ = [
    "CANCELLED_MESSAGE",
    "CANCELLED_MESSAGES",
    "DEAD_LETTER_SUFFIX",
    "EXHAUSTED_SUFFIX",
    "MESSAGE_GLOSSES",
    "NOT_NEEDED_MESSAGE",
    "NO_RETRY_SUFFIX",
    "NO_SUBSCRIBERS_MESSAGE",
    "PUBLISHED_MESSAGE",
    "RESCUED_ERROR",
    "RETRY_SUFFIX",
    "STEP_MESSAGE",
    "STOPPED_MESSAGE",
    "SUCCESS_MESSAGE",
    "SUFFIX_GLOSSES",
    "carried_columns",
    "dead_letter_message",
    "dead_letter_row",
    "failure_message",
    "retry_row",
]

# ------------------------------------------------------------- the seed's texts
#: ``mensagem`` of a success whose handler returned nothing
SUCCESS_MESSAGE = "Concluído com sucesso"
#: after a failure's error, when a next attempt is enqueued
RETRY_SUFFIX = ". Tarefa reenfileirada."
#: after a failure's error, when the attempts are spent
EXHAUSTED_SUFFIX = ". Máximo de tentativas atingido."
#: an exception the worker class declared not worth retrying (``no_retry``)
NO_RETRY_SUFFIX = ". Falha sem nova tentativa: enviada à fila de mortos."
#: the failure of an attempt whose worker died (the rescue's)
RESCUED_ERROR = "Falha desconhecida de processamento (processamento abortado repentinamente)"
#: a publication fanned out to its subscribers
PUBLISHED_MESSAGE = "Publicado para os assinantes, com sucesso!"
#: a publication with no subscriber
NO_SUBSCRIBERS_MESSAGE = "Não haviam assinantes configurados! Tarefa descartada sem nenhuma ação."

#: a waiting task an operator cancelled (``sqla-queue cancel``); its status
#: is ``falha`` with ``estouro_tentativas`` false: finished, not dead-lettered
CANCELLED_MESSAGE = "Tarefa cancelada pelo operador."
#: ``mensagem`` of a workflow step that others wait for, until it ends (the
#: success's or the failure's text replaces it; a retry carries it): how a
#: worker knows, from the claimed row alone, that this task has children to
#: release (client/workflow.py, batch/workflow.py), without a statement for
#: every other task
STEP_MESSAGE = "Etapa de fluxo: ao concluir, libera as etapas seguintes."
#: a waiting workflow step cancelled because a step before it went to the
#: dead letter (policies ``stop`` and ``compensate``); a requeue of that
#: step makes it wait again
STOPPED_MESSAGE = "Etapa cancelada: uma etapa anterior do fluxo foi para a fila de mortos."
#: a workflow's compensation step, cancelled because the workflow succeeded
NOT_NEEDED_MESSAGE = "Compensação não necessária: o fluxo terminou com sucesso."
#: the ``mensagem`` of a waiting task cancelled (``falha``, state
#: ``cancelled``): by an operator, or by its workflow
CANCELLED_MESSAGES = (CANCELLED_MESSAGE, STOPPED_MESSAGE, NOT_NEEDED_MESSAGE)

#: a dead-letter run the default handler ran (``WorkerBase.execute_dead``):
#: its text after "Tarefa com ID <the chain>" (:func:`dead_letter_message`)
DEAD_LETTER_SUFFIX = (
    " excedeu o número de tentativas, sem sucesso. Será necessária intervenção manual."
)

#: what the texts above say, in English, for a person reading them
#: (``sqla-queue status --task`` and the dashboard's task page show it
#: beside the stored text, which stays as it is): whole messages, then the
#: suffixes after a failure's error (and the dead-letter text's, after the
#: task's id)
MESSAGE_GLOSSES = {
    SUCCESS_MESSAGE: "completed successfully",
    RESCUED_ERROR: "unknown processing failure (the processing stopped suddenly)",
    PUBLISHED_MESSAGE: "published to the subscribers",
    NO_SUBSCRIBERS_MESSAGE: "no subscriber configured: discarded, nothing done",
    CANCELLED_MESSAGE: "cancelled by the operator",
    STEP_MESSAGE: "a workflow step: its success releases the steps after it",
    STOPPED_MESSAGE: "cancelled: a workflow step before it went to the dead letter",
    NOT_NEEDED_MESSAGE: "compensation not needed: the workflow succeeded",
}
SUFFIX_GLOSSES = {
    RETRY_SUFFIX: "retry enqueued",
    EXHAUSTED_SUFFIX: "maximum attempts reached",
    NO_RETRY_SUFFIX: "failed with no retry: sent to the dead letter",
    DEAD_LETTER_SUFFIX: "used up its attempts without success: it needs a person",
}


def dead_letter_message(chain_id: int | None) -> str:
    """The default dead-letter handler's ``mensagem`` for the task whose
    chain starts at ``chain_id``, the seed's words."""
    return f"Tarefa com ID {chain_id}{DEAD_LETTER_SUFFIX}"


def failure_message(error: str, suffix: str) -> str:
    """``error`` and ``suffix`` (". Tarefa reenfileirada.", nsj-queue-lib's
    f"{e}. Tarefa reenfileirada."), with one period between them when the
    error already ends its sentence, cut to fit ``mensagem``."""
    if error.rstrip().endswith("."):
        error, suffix = error.rstrip(), suffix.removeprefix(".")
    return fit_message(error, MESSAGE_MAX_LENGTH, suffix)


# ------------------------------------------------------------- the rows
def carried_columns(task: TaskRecord) -> dict[str, Any]:
    """What every row that follows ``task`` keeps of it (a retry, its
    dead-letter run, a requeued chain): its keys, routing, hash, priority
    (the reference reset it to 50), the trace that enqueued it and the
    user's own columns."""
    return {
        "origem": task.origin,
        "destino": task.destination,
        "processo": task.process,
        "chave_externa": task.external_key,
        "tenant": task.tenant,
        "grupo_empresarial": task.company_group,
        "payload_hash": task.payload_hash,
        "pub_sub": task.pub_sub,
        "publication_id": task.publication_id,
        "subscriber_id": task.subscriber_id,
        "prioridade": task.priority,
        "trace_context": task.trace_context,
        **task.extra,
    }


def retry_row(
    task: TaskRecord, next_at: dt.datetime, failed_status: str, message: str, now: dt.datetime
) -> dict[str, Any]:
    """The next attempt of ``task``, which failed with ``message``: due at
    ``next_at`` (``agendada`` until then), linked to the failed attempt."""
    return {
        **carried_columns(task),
        "id_inicial": task.chain_id,
        "data_hora_inicial": task.first_run_at,
        "data_hora": next_at,
        "tentativa": task.attempt + 1,
        "status": (Status.SCHEDULED if next_at > now else Status.PENDING).value,
        "id_anterior": task.id,
        "data_hora_anterior": task.run_at,
        "status_anterior": failed_status,
        "mensagem_anterior": message,
        # a workflow step's next attempt still has children to release
        "mensagem": STEP_MESSAGE if task.message == STEP_MESSAGE else None,
        "payload": None,  # the first attempt keeps it
        "dead": task.dead,
        "live_id": task.live_id,
    }


def dead_letter_row(task: TaskRecord) -> dict[str, Any]:
    """The first row of ``task``'s dead-letter run: a new chain (``dead``,
    ``live_id`` = the task's chain) with its payload, hash and priority."""
    return {
        **carried_columns(task),
        "tentativa": 1,
        "status": Status.PENDING.value,
        "payload": task.payload_text,  # the reference lost it on rescued tasks
        "dead": True,
        "live_id": task.chain_id,
    }
