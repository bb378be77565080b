"""The webhook worker end to end: ``sqla-queue webhook`` and the pub/sub
handoff, on every database, against real HTTP servers on 127.0.0.1
(tests/integration/test_webhooks.py's), through the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

from sqla_queue import SubscriberWebhook, WorkerPubSubBase, WorkerWebhook
from tests.conftest import created_engine, run_cli, server_url, spawn_cli, wait_until
from tests.integration.test_pubsub import publish, rows
from tests.integration.test_webhooks import (
    AZURE_KEY,
    SIGNING_SECRET,
    SLACK_PATH,
    TOKEN,
    _closed_port,
    _Server,
)
from tests.integration.test_worker import drain
from tests.support.pubsub_app import PubSubApp

LOCAL_NETWORK = "127.0.0.1/32"


def subscribe(engine: Engine, papp: PubSubApp, *subscriptions: dict[str, Any]) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(papp.Subscriber(**row) for row in subscriptions)


def _env(papp: PubSubApp, **extra: str) -> dict[str, str]:
    return {
        "SQLA_QUEUE_TEST_TABLE": papp.Task.__tablename__,
        "QUEUE_MAX_RETRY": "2",
        "QUEUE_BASE_INTERVAL_RETRY": "0",
        # the test servers listen on 127.0.0.1: the guard (on) lets it through
        "WEBHOOK_ALLOWED_NETWORKS": LOCAL_NETWORK,
        **extra,
    }


def _webhook_cli(db_url: str, papp: PubSubApp, *args: str, check: bool = True, **env: str) -> Any:
    return run_cli(
        "webhook",
        "--model",
        "tests.support.pubsub_app:Task",
        "--subscriber-model",
        "tests.support.pubsub_app:Subscriber",
        "--url",
        db_url,
        "--burst",
        *args,
        env=_env(papp, **env),
        check=check,
    )


def _every_row_text(engine: Engine, papp: PubSubApp) -> str:
    with engine.connect() as conn:
        found = conn.execute(select(papp.Task.__table__)).all()
    return "\n".join(repr(tuple(row)) for row in found)


def test_webhook_worker_delivers_each_subscription(
    db_url: str, pengine: Engine, papp: PubSubApp, server: _Server, other_server: _Server
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Tenant": "7"}
    subscribe(
        pengine,
        papp,
        {
            "id": "ok",
            "process": "evento",
            "url": server.url("/echo"),
            "headers": headers,
            "signing_secret": SIGNING_SECRET,
        },
        {"id": "put", "process": "evento", "url": server.url("/echo/201"), "http_method": "PUT"},
        {"id": "get", "process": "evento", "url": server.url("/echo"), "http_method": "get"},
        {"id": "e404", "process": "evento", "url": server.url("/status/404")},
        {"id": "e503", "process": "evento", "url": server.url("/status/503")},
        {"id": "slow", "process": "evento", "url": server.url("/slow")},
        {"id": "refused", "process": "evento", "url": f"http://127.0.0.1:{_closed_port()}/"},
        {
            "id": "away",
            "process": "evento",
            "url": server.url("/redirect?to=" + other_server.url("/echo")),
            "headers": headers,
        },
        {"id": "huge", "process": "evento", "url": server.url("/huge")},
        {"id": "off", "process": "evento", "url": server.url("/echo"), "active": False},
    )
    pub_id = publish(pengine, papp, {"pedido": 42, "texto": "ação"}, process="evento")

    proc = _webhook_cli(db_url, papp, "--concurrency", "2", DEFAULT_WEBHOOK_TIMEOUT="0.5")
    server.release.set()

    tasks = rows(pengine, papp)
    live = {t.subscriber_id: t for t in tasks if t.initial_id is None and not t.dead}
    assert live.pop(None).id == pub_id  # the publication
    assert sorted(live) == sorted(
        ["ok", "put", "get", "e404", "e503", "slow", "refused", "away", "huge"]
    )
    by_id = {
        t.subscriber_id: [u for u in tasks if u.subscriber_id == t.subscriber_id]
        for t in live.values()
    }
    for ok in ("ok", "put", "get"):
        [only] = by_id[ok]
        assert only.status == "sucesso", (ok, only.message)
        assert only.message.startswith("Webhook disparado com sucesso na URL: ")
    for failing, why in (
        ("e404", "Status Resposta: 404"),
        ("e503", "Status Resposta: 503"),
        ("slow", "timeout"),
        ("refused", "refused"),
        ("away", "redirect"),
    ):
        attempts = [t for t in by_id[failing] if not t.dead]
        assert [(t.attempt, t.status) for t in attempts] == [(1, "falha"), (2, "falha")], failing
        assert why in attempts[0].message, (failing, attempts[0].message)
        [dead] = [t for t in by_id[failing] if t.dead]
        assert dead.status == "sucesso"  # the default dead handler ran once
    # a huge answer with a 200 is a success, read no further than 64 KiB
    assert [t.status for t in by_id["huge"]] == ["sucesso"]

    received = {
        r["path"]: r for r in server.received if r["method"] == "POST" and r["path"] == "/echo"
    }
    post = received["/echo"]
    assert post["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert json.loads(post["body"]) == {"pedido": 42, "texto": "ação"}
    # the signature, checked by an independent implementation of the spec
    assert Webhook(SIGNING_SECRET).verify(post["body"], post["headers"]) is not None
    assert post["headers"]["webhook-id"] == str(live["ok"].id)
    get = next(r for r in server.received if r["method"] == "GET" and r["path"] == "/echo")
    assert "pedido=42" in get["query"] and get["body"] == ""
    # the other origin never saw the token (the redirect was refused)
    assert other_server.received == []
    # each failing subscription: its two attempts share one webhook-id
    ids_404 = {r["headers"]["webhook-id"] for r in server.received if r["path"] == "/status/404"}
    assert ids_404 == {str(live["e404"].id)}
    # no header value and no secret in any log line or any row
    output = proc.stdout + proc.stderr
    stored = _every_row_text(pengine, papp)
    for secret in (TOKEN, SIGNING_SECRET, SIGNING_SECRET[6:]):
        assert secret not in output
        assert secret not in stored


def test_no_transaction_is_open_while_a_call_is_in_flight(papp: PubSubApp, server: _Server) -> None:
    """On PostgreSQL, whose pg_stat_activity shows each session's state."""
    db_url = server_url("postgresql")
    with created_engine(db_url, papp.Base.metadata) as pengine:
        _check_no_transaction_during_call(db_url, pengine, papp, server)


def _check_no_transaction_during_call(
    db_url: str, pengine: Engine, papp: PubSubApp, server: _Server
) -> None:
    subscribe(pengine, papp, {"id": "held", "process": "evento", "url": server.url("/slow")})
    publish(pengine, papp, {"n": 1}, process="evento")
    name = f"sqlaq-{uuid.uuid4().hex[:8]}"
    worker = spawn_cli(
        "webhook",
        "--model",
        "tests.support.pubsub_app:Task",
        "--subscriber-model",
        "tests.support.pubsub_app:Subscriber",
        "--url",
        f"{db_url}?application_name={name}",
        "--burst",
        env=_env(papp),
    )
    try:
        wait_until(lambda: server.received or worker.poll() is not None, message="the webhook call")
        assert worker.poll() is None, worker.communicate()[0]
        assert not _transactions_held(pengine, name)
    finally:
        server.release.set()
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    [copy] = [t for t in rows(pengine, papp) if t.subscriber_id == "held"]
    assert copy.status == "sucesso"


def _transactions_held(engine: Engine, name: str, seconds: float = 0.5) -> list[Any]:
    """The worker's sessions (application_name ``name``) that stay idle in
    one transaction for ``seconds`` of back-to-back samples: a transaction
    held across the call. A routine's transaction seen between two of its
    statements (a loaded machine shows that now and then) is gone by the
    next samples, so it is not one."""
    held: set[tuple[Any, ...]] | None = None
    seen: list[Any] = []
    query = text(
        "SELECT pid, xact_start, left(query, 200) AS query FROM pg_stat_activity "
        "WHERE application_name = :n AND state LIKE 'idle in transaction%'"
    )
    sessions = text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n")
    with engine.connect() as conn:
        assert conn.execute(sessions, {"n": name}).scalar_one(), "the worker's sessions"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or held is None:
            rows = conn.execute(query, {"n": name}).all()
            conn.rollback()  # each sample in a transaction of its own
            seen = rows
            now = {(row.pid, row.xact_start) for row in rows}
            held = now if held is None else held & now
            if not held:
                return []
    return [row for row in seen if (row.pid, row.xact_start) in (held or set())]


def test_pubsub_worker_hands_its_webhook_subscriptions_to_the_delivery(
    pengine: Engine, papp: PubSubApp, server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEBHOOK_ALLOWED_NETWORKS", LOCAL_NETWORK)
    subscribe(
        pengine,
        papp,
        {"id": "ok", "process": "pedido"},
        {"id": "hook", "process": "pedido", "url": server.url("/echo/202")},
    )
    base: Any = papp.PubSubWorker

    @SubscriberWebhook("hook")
    class Mixed(base):  # type: ignore[misc,valid-type]
        pass

    assert Mixed.webhook_subscribers == {"hook"} and base.webhook_subscribers == frozenset()
    publish(pengine, papp, {"pedido": 7})
    drain(Mixed, pengine)
    by_sub = {t.subscriber_id: t for t in rows(pengine, papp)}
    assert by_sub["ok"].message == "ok done"
    assert by_sub["hook"].status == "sucesso" and "Status Resposta: 202" in by_sub["hook"].message
    assert [r["body"] for r in server.received] == ['{"pedido": 7}']


def test_routing_a_webhook_worker_claims_publications_and_every_copy(papp: PubSubApp) -> None:
    from sqla_queue.enqueue.routing import claim_filter_of

    hooks = type(
        "Hooks", (WorkerWebhook,), {"model": papp.Task, "subscriber_model": papp.Subscriber}
    )
    found = claim_filter_of(hooks)
    assert found is not None and found.all_subscribers and found.processes is None
    only = type("Only", (hooks,), {"processes": {"evento"}})
    assert claim_filter_of(only).processes == {"evento"}  # type: ignore[union-attr]
    with pytest.raises(Exception, match="decorates a WorkerPubSubBase subclass"):
        SubscriberWebhook("x")(object)  # type: ignore[type-var]
    assert issubclass(hooks, WorkerPubSubBase)


def test_webhook_cli_refuses_what_is_not_a_model(papp: PubSubApp) -> None:
    proc = run_cli(
        "webhook",
        "--model",
        "tests.support.pubsub_app:PlainWorker",
        "--subscriber-model",
        "tests.support.pubsub_app:Subscriber",
        "--url",
        "sqlite://",
        env=_env(papp),
        check=False,
    )
    assert proc.returncode == 1
    assert "'tests.support.pubsub_app:PlainWorker' is not a mapped QueueMixin model" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_worker_refuses_internal_destinations_by_default(
    db_url: str, pengine: Engine, papp: PubSubApp, server: _Server
) -> None:
    subscribe(
        pengine,
        papp,
        {"id": "inside", "process": "evento", "url": server.url(f"/echo{SLACK_PATH}")},
        {
            "id": "sneaky",
            "process": "evento",
            "url": f"http://127.0.0.1:{server.port}\\@8.8.8.8/echo",
        },
    )
    publish(pengine, papp, {"n": 1}, process="evento")
    _webhook_cli(db_url, papp, WEBHOOK_ALLOWED_NETWORKS="")
    assert server.received == []
    copies = [t for t in rows(pengine, papp) if t.subscriber_id and not t.dead]
    assert sorted({t.subscriber_id for t in copies}) == ["inside", "sneaky"]
    for copy in copies:
        assert copy.status == "falha"  # retried, then the dead letter, like any failure
        assert "Status Resposta: -. " in copy.message  # no response, no body stored
    inside = next(t for t in copies if t.subscriber_id == "inside")
    assert inside.message.startswith(
        f"WebhookDeliveryFailed: Webhook falhou na URL: http://127.0.0.1:{server.port}/***. "
    )
    assert "destination refused: 127.0.0.1 is 127.0.0.1, a loopback address" in inside.message


def test_the_worker_delivers_anywhere_with_the_guard_off(
    db_url: str, pengine: Engine, papp: PubSubApp, server: _Server
) -> None:
    subscribe(pengine, papp, {"id": "inside", "process": "evento", "url": server.url("/echo")})
    publish(pengine, papp, {"n": 1}, process="evento")
    _webhook_cli(db_url, papp, WEBHOOK_ALLOWED_NETWORKS="", WEBHOOK_BLOCK_PRIVATE_NETWORKS="false")
    [copy] = [t for t in rows(pengine, papp) if t.subscriber_id == "inside"]
    assert copy.status == "sucesso" and len(server.received) == 1


def test_a_bad_allowed_network_stops_the_worker_at_start(papp: PubSubApp) -> None:
    proc = _webhook_cli(
        "sqlite://", papp, check=False, WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32, intranet"
    )
    assert proc.returncode != 0
    assert "WEBHOOK_ALLOWED_NETWORKS: 'intranet' is not an IP address or CIDR range" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_dripping_endpoint_fails_the_copy_at_the_deadline(
    db_url: str, pengine: Engine, papp: PubSubApp, server: _Server
) -> None:
    subscribe(
        pengine, papp, {"id": "drip", "process": "evento", "url": server.url("/drip/headers")}
    )
    publish(pengine, papp, {"n": 1}, process="evento")
    proc = _webhook_cli(db_url, papp, DEFAULT_WEBHOOK_TIMEOUT="1", QUEUE_MAX_RETRY="1")
    [copy] = [t for t in rows(pengine, papp) if t.subscriber_id == "drip" and not t.dead]
    assert copy.status == "falha"
    assert "Mensagem: timeout: no complete response within 1 s." in copy.message
    assert "\n" not in copy.message
    # the drip would have held the delivery for 40 s (DRIP_BYTES * DRIP_SECONDS)
    assert len(server.received) == 1, proc.stderr


def test_secrets_in_a_subscription_url_reach_no_row_and_no_log_line(
    db_url: str, pengine: Engine, papp: PubSubApp, server: _Server
) -> None:
    query = f"code={AZURE_KEY}"
    subscribe(
        pengine,
        papp,
        {"id": "slack", "process": "evento", "url": server.url(f"/echo/500{SLACK_PATH}")},
        {"id": "azure", "process": "evento", "url": server.url(f"/echo?{query}")},
        {
            "id": "gone",
            "process": "evento",
            "url": f"http://127.0.0.1:{_closed_port()}{SLACK_PATH}?{query}",
        },
    )
    publish(pengine, papp, {"n": 1}, process="evento")
    proc = _webhook_cli(db_url, papp, "--log-level", "DEBUG")
    output = proc.stdout + proc.stderr
    assert "task failed" in output.lower() or "WebhookDeliveryFailed" in output
    assert "urllib3" in output  # its DEBUG lines were there, masked
    stored = _every_row_text(pengine, papp)
    for secret in ("T0SECRET1", "XyZsEcReT", AZURE_KEY):
        assert secret not in output
        assert secret not in stored
    assert len(server.received) >= 3
