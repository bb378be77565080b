"""The dashboard's JSON API for tasks and workers (issue 50), from a plain
HTTP client on a real uvicorn, on SQLite, PostgreSQL and MariaDB:
``GET /api/tasks`` walks every task once, newest first, a page at a time;
filters by state (``cancelled`` and ``dead_letter`` included), process,
external key and id range; answers a bad parameter with 400 and one line
of JSON; shows payloads with their secrets masked, as ``GET /api/tasks/ID``
does; ``GET /api/workers`` names the workers holding tasks; a task page
and ``status --task`` follow the default dead-letter text with its English.
Every call needs the login, unless the dashboard is read-only."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
from typing import Any

import requests
from sqlalchemy import Engine, insert

from sqla_queue.adapters import adapter_of
from sqla_queue.client.queue import QueueClient
from sqla_queue.common.redaction import MASK
from sqla_queue.common.types import utcnow
from tests.acceptance.test_dashboard import dead_task, logged_in, serving
from tests.conftest import run_cli
from tests.support.app import App

#: the keys of a task in /api/tasks, exactly
TASK_KEYS = {
    "id",
    "chain",
    "process",
    "state",
    "attempt",
    "external_key",
    "payload",
    "run_at",
    "started_at",
    "finished_at",
}
#: how far this process's clock and the database's may be apart (same machine)
CLOCK_TOLERANCE_SECONDS = 5.0


def enqueue(engine: Engine, app: App, tasks: list[dict[str, Any]]) -> list[int]:
    with engine.begin() as conn:
        return QueueClient(conn, app.Task).insert_tasks(tasks)


def walk(web: Any, base: str, **query: Any) -> list[list[dict[str, Any]]]:
    """Every page of /api/tasks for ``query``, following ``next``."""
    pages: list[list[dict[str, Any]]] = []
    after = None
    for _ in range(100):
        params = {**query, **({} if after is None else {"after": after})}
        answer = web.get(f"{base}/api/tasks", params=params, timeout=30)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) == {"tasks", "next"}
        pages.append(body["tasks"])
        after = body["next"]
        if after is None:
            return pages
        assert isinstance(after, str)
    raise AssertionError("next never came back null")


def ids_of(tasks: list[dict[str, Any]]) -> list[int]:
    return [task["id"] for task in tasks]


def test_api_tasks_walks_every_task_once_newest_first(engine: Engine, app: App) -> None:
    ids = enqueue(
        engine,
        app,
        [{"processo": "a" if n % 2 else "b", "payload": {"n": n}} for n in range(130)],
    )
    with serving(engine, app) as base:
        assert requests.get(f"{base}/api/tasks", timeout=10).status_code == 401
        web, _ = logged_in(base)
        pages = walk(web, base, limit=50)
        assert [len(page) for page in pages] == [50, 50, 30]
        walked = [task for page in pages for task in page]
        assert ids_of(walked) == sorted(ids, reverse=True)  # each once, strictly decreasing
        assert all(set(task) == TASK_KEYS for task in walked)
        newest = walked[0]
        assert (newest["chain"], newest["state"], newest["attempt"]) == (ids[-1], "ready", 1)
        assert newest["payload"] == {"n": 129} and newest["process"] == "a"
        run_at = dt.datetime.fromisoformat(newest["run_at"])
        assert run_at.utcoffset() == dt.timedelta(0)
        assert newest["started_at"] is None and newest["finished_at"] is None
        # the default page is 50
        first = web.get(f"{base}/api/tasks", timeout=10).json()
        assert ids_of(first["tasks"]) == ids_of(pages[0]) and first["next"] is not None
        # the other filters
        only_a = [task for page in walk(web, base, process="a", limit=500) for task in page]
        assert ids_of(only_a) == sorted(ids[1::2], reverse=True)
        low, high = ids[10], ids[19]
        ranged = walk(web, base, min_id=low, max_id=high, limit=3)
        assert ids_of([t for page in ranged for t in page]) == sorted(ids[10:20], reverse=True)


def test_api_tasks_filters_by_state_and_process(engine: Engine, app: App, installed: None) -> None:
    dead = dead_task(engine, app, {"n": 1})
    ready, cancelled, keyed = enqueue(
        engine,
        app,
        [
            {"processo": "relatorio", "payload": {"n": 2}},
            {"processo": "relatorio", "payload": {"n": 3}},
            {"processo": "outro", "payload": {"n": 4}, "chave_externa": "pedido-9"},
        ],
    )
    with engine.begin() as conn:
        QueueClient(conn, app.Task).cancel(cancelled)
    with serving(engine, app, read_only=True, password=None) as base:  # reads: no login

        def listed(**query: Any) -> list[dict[str, Any]]:
            return [task for page in walk(requests, base, **query) for task in page]

        assert ids_of(listed(state="ready")) == [keyed, ready]
        assert ids_of(listed(state="ready", process="relatorio")) == [ready]
        assert ids_of(listed(external_key="pedido-9")) == [keyed]
        assert ids_of(listed(state="cancelled")) == [cancelled]
        failed = listed(state="failed")
        assert [task["chain"] for task in failed] == [dead]  # its last attempt, not the cancelled
        assert failed[0]["finished_at"] is not None
        dead_runs = listed(state="dead_letter")
        assert len(dead_runs) == 1 and dead_runs[0]["id"] > dead
        assert listed(state="running") == [] and listed(state="scheduled") == []
        every = listed()
        assert {task["state"] for task in every} == {"ready", "cancelled", "failed", "dead_letter"}
        for state in ("ready", "cancelled", "failed", "dead_letter"):
            assert [t["id"] for t in every if t["state"] == state] == ids_of(listed(state=state))


def test_bad_query_parameters_answer_400_with_one_line_of_json(engine: Engine, app: App) -> None:
    enqueue(engine, app, [{"processo": "a", "payload": {}}])
    bad = [
        {"limit": "0"},
        {"limit": "501"},
        {"limit": "abc"},
        {"limit": "-1"},
        {"limit": "1.5"},
        {"limit": "9" * 5000},
        {"state": "bogus"},
        {"state": "<script>\x1b]0;x\x07"},
        {"after": "xyz"},
        {"after": "0"},
        {"after": str(2**63)},
        {"min_id": "abc"},
        {"max_id": "-5"},
        {"process": "a\x00b"},
        {"external_key": "\x00"},
    ]
    with serving(engine, app) as base:
        web, _ = logged_in(base)
        for query in bad:
            answer = web.get(f"{base}/api/tasks", params=query, timeout=10)
            assert answer.status_code == 400, (query, answer.text)
            assert "\n" not in answer.text.strip(), query
            body = answer.json()
            assert list(body) == ["error"] and body["error"], query
            assert len(body["error"]) < 300, query
        assert web.get(f"{base}/api/tasks", params={"limit": "500"}, timeout=10).status_code == 200
        said = web.get(f"{base}/api/tasks", params={"limit": "0"}, timeout=10).json()["error"]
        assert said == "limit '0' is not a whole number from 1 to 500"


def test_payloads_are_shown_with_their_secrets_masked(engine: Engine, app: App) -> None:
    secret = {
        "password": "hunter2",
        "token": {"value": "tok-123"},
        "nested": [{"api_key": "key-456"}],
        "dsn": "postgresql://user:pw-789@db/queue",
        "n": 1,
    }
    [task_id] = enqueue(engine, app, [{"processo": "a", "payload": secret}])
    with serving(engine, app) as base:
        web, _ = logged_in(base)
        listed = web.get(f"{base}/api/tasks", timeout=10)
        one = web.get(f"{base}/api/tasks/{task_id}", timeout=10)
        shown_page = web.get(f"{base}/tasks/{task_id}", timeout=10)  # the task's page too
    assert 'id="payload"' in shown_page.text and MASK in shown_page.text
    for answer in (listed, one, shown_page):
        assert answer.status_code == 200
        for shown in ("hunter2", "tok-123", "key-456", "pw-789"):
            assert shown not in answer.text
    expected = {
        "password": MASK,
        "token": MASK,
        "nested": [{"api_key": MASK}],
        "dsn": f"postgresql://user:{MASK}@db/queue",
        "n": 1,
    }
    assert listed.json()["tasks"][0]["payload"] == expected
    assert one.json()["payload"] == expected and one.json()["task_id"] == task_id


def test_api_workers_names_a_worker_holding_a_claimed_task(engine: Engine, app: App) -> None:
    enqueue(engine, app, [{"processo": "a", "payload": {"n": n}} for n in range(3)])
    adapter = adapter_of(engine.dialect, app.Task.__table__)
    claimed_at = utcnow()
    with engine.connect() as conn, conn.begin():
        taken = adapter.task_claim_many(conn, limit=2, owner="worker-1", lease_seconds=30)
    assert len(taken) == 2
    with serving(engine, app, lease_seconds=30) as base:
        assert requests.get(f"{base}/api/workers", timeout=10).status_code == 401
        web, _ = logged_in(base)
        answer = web.get(f"{base}/api/workers", timeout=10)
        running = web.get(f"{base}/api/tasks", params={"state": "running"}, timeout=10).json()
    assert answer.status_code == 200
    [worker] = answer.json()["workers"]
    assert set(worker) == {"worker_id", "tasks", "last_heartbeat"}
    assert (worker["worker_id"], worker["tasks"]) == ("worker-1", 2)
    beat = dt.datetime.fromisoformat(worker["last_heartbeat"])
    assert beat.utcoffset() == dt.timedelta(0)
    assert abs((beat - claimed_at).total_seconds()) <= CLOCK_TOLERANCE_SECONDS
    assert sorted(ids_of(running["tasks"])) == sorted(task.id for task in taken)
    assert all(task["started_at"] is not None for task in running["tasks"])


def test_an_empty_queue_lists_nothing(engine: Engine, app: App) -> None:
    with serving(engine, app, read_only=True, password=None) as base:
        assert requests.get(f"{base}/api/tasks", timeout=10).json() == {"tasks": [], "next": None}
        assert requests.get(f"{base}/api/workers", timeout=10).json() == {"workers": []}
        answer = requests.get(f"{base}/api/tasks", params={"state": "failed"}, timeout=10)
        assert json.loads(answer.text) == {"tasks": [], "next": None}


def test_the_task_browser_page_filters_and_pages_with_a_next_link(engine: Engine, app: App) -> None:
    hostile = "<script>window.hacked=1</script>\x1b]0;x\x07 \u202etxt.exe"
    ids = enqueue(
        engine,
        app,
        [{"processo": "a", "payload": {"n": n, "say": hostile, "token": "tok-1"}} for n in range(3)]
        + [{"processo": "b", "payload": {"n": 9}}],
    )
    with serving(engine, app) as base:
        assert requests.get(f"{base}/tasks", timeout=10, allow_redirects=False).status_code == 303
        web, _ = logged_in(base)
        url: str | None = f"{base}/tasks?state=ready&process=a&limit=2"
        seen: list[int] = []
        for _ in range(5):
            assert url is not None
            html = web.get(url, timeout=10)
            assert html.status_code == 200
            assert "<script>window" not in html.text and "tok-1" not in html.text
            assert "&lt;script&gt;" in html.text and "\\u001b" in html.text
            assert "\u202e" not in html.text and "\\u202e" in html.text
            seen += [int(i) for i in re.findall(r'<td><a href="/tasks/(\d+)">', html.text)]
            found = re.search(r'<a id="next" href="([^"]+)"', html.text)
            url = None if found is None else base + found.group(1).replace("&amp;", "&")
            if url is None:
                assert 'id="last"' in html.text
                break
        assert seen == sorted(ids[:3], reverse=True)
        bad = web.get(f"{base}/tasks?limit=0", timeout=10)
        assert bad.status_code == 400 and 'id="error"' in bad.text
        # the form's empty fields mean any
        every = web.get(f"{base}/tasks?state=&process=&external_key=&limit=", timeout=10)
        assert every.status_code == 200
        assert re.findall(r'<td><a href="/tasks/(\d+)">', every.text) == [
            str(i) for i in reversed(ids)
        ]


def test_a_retrys_page_and_api_show_its_chains_payload(engine: Engine, app: App) -> None:
    """A retry's row may hold no payload of its own: the chain's first
    attempt's is shown (was null)."""
    [first] = enqueue(engine, app, [{"processo": "a", "payload": {"order": 7, "token": "t-1"}}])
    with engine.begin() as conn:
        retry = conn.execute(
            insert(app.Task.__table__).values(
                processo="a", id_inicial=first, tentativa=2, status="pendente"
            )
        ).inserted_primary_key[0]
    with serving(engine, app) as base:
        web, _ = logged_in(base)
        one = web.get(f"{base}/api/tasks/{retry}", timeout=10)
        shown = web.get(f"{base}/tasks/{retry}", timeout=10)
    assert one.json()["payload"] == {"order": 7, "token": MASK}
    assert '"order": 7' in html.unescape(shown.text) and "t-1" not in shown.text


def test_the_default_dead_letter_message_has_its_english_in_the_cli_and_the_task_page(
    engine: Engine, app: App, installed: None, db_url: str
) -> None:
    """The default dead-letter handler's text, stored as the seed writes
    it, is followed by its English in brackets (as the other fixed texts)."""
    dead = dead_task(engine, app, {"n": 1}, default_dead=True)
    stored = (
        f"Tarefa com ID {dead} excedeu o número de tentativas, sem sucesso. "
        "Será necessária intervenção manual. "
        "[used up its attempts without success: it needs a person]"
    )
    with serving(engine, app) as base:
        web, _ = logged_in(base)
        page = web.get(f"{base}/tasks/{dead}", timeout=30).text
    row = re.search(r'<tr class="dead_letter">(.*?)</tr>', page, re.S)
    assert row, page
    cell = re.sub(r"<[^>]+>", "", row.group(1).split('<td class="msg">')[1])
    assert " ".join(html.unescape(cell).split()) == stored
    worker = ["tests.support.app:RecordingWorker", "--url", db_url, "--task", str(dead)]
    done = run_cli("status", *worker, env={"SQLA_QUEUE_TEST_TABLE": app.Task.__tablename__})
    # the message column, its lines joined (rich wraps a long message)
    cells = [line.split("│")[-2] for line in done.stdout.splitlines() if line.count("│") > 2]
    assert stored in " ".join(" ".join(cells).split()), done.stdout
