"""The dashboard's history, workers and processes views (issue 50), from a
plain HTTP client on a real uvicorn, on SQLite, PostgreSQL and MariaDB:
``GET /api/history`` puts attempts finished at chosen minutes in their
buckets (per process, as succeeded, failed or cancelled), and the overview
draws them on its first load, axes and legend included; ``/workers`` lists
the workers holding tasks; ``/processes`` shows each process's counts, its
limits and a pause button that pauses it; ``POST /api/tasks/bulk/ACTION``
requeues, cancels or retries a selection or a filter's tasks, each id's
outcome reported, refused in read-only mode, and answers garbage bodies
with 4xx and one line of JSON, the table untouched. In a real browser
(SQLite, PostgreSQL): the views clicked through, the task browser filtered
by clicking, a bulk requeue, a process paused and resumed by clicking."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any, ClassVar

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import Engine, select, update

from sqla_queue.adapters import adapter_of
from sqla_queue.client.pause import paused_processes
from sqla_queue.client.queue import QueueClient
from sqla_queue.common.types import utcnow
from sqla_queue.ops import status_counts
from sqla_queue.ops.dashboard.history import finished_history
from sqla_queue.schema.rows import CANCELLED_MESSAGE, SUCCESS_MESSAGE
from tests.acceptance import test_dashboard
from tests.acceptance.test_dashboard import CSRF, dead_task, log_in, logged_in, serving
from tests.support.app import App

#: the headless browser of test_dashboard.py (a fixture, one per module)
browser = test_dashboard.browser


def finished(engine: Engine, app: App, rows: list[tuple[str, str, str, dt.datetime]]) -> None:
    """Tasks (process, status, message, finished at) as if they had run."""
    table = app.Task.__table__
    with engine.begin() as conn:
        ids = QueueClient(conn, app.Task).insert_tasks(
            [{"processo": process, "payload": {}} for process, *_ in rows]
        )
        for task_id, (_, status, message, at) in zip(ids, rows, strict=True):
            conn.execute(
                update(table)
                .where(table.c.id == task_id)
                .values(status=status, mensagem=message, finished_at=at, started_at=at)
            )


def floor(at: dt.datetime, seconds: int) -> str:
    epoch = at.timestamp()
    return dt.datetime.fromtimestamp(epoch - epoch % seconds, dt.timezone.utc).isoformat()


def test_history_puts_finished_attempts_in_their_buckets(engine: Engine, app: App) -> None:
    now = utcnow()
    early, late, old = (now - dt.timedelta(minutes=m) for m in (30, 5, 180))
    finished(
        engine,
        app,
        [
            ("faturar", "sucesso", SUCCESS_MESSAGE, early),
            ("faturar", "sucesso", SUCCESS_MESSAGE, early),
            ("faturar", "falha", "boom", early),
            ("enviar", "falha", CANCELLED_MESSAGE, late),
            ("enviar", "falha_processando", "lost", late),
            ("enviar", "sucesso", SUCCESS_MESSAGE, old),  # the day's, not the hour's
            ("enviar", "sucesso", SUCCESS_MESSAGE, now - dt.timedelta(days=2)),  # neither
        ],
    )
    with serving(engine, app) as base:
        assert requests.get(f"{base}/api/history", timeout=10).status_code == 401
        web, _ = logged_in(base)
        hour = web.get(f"{base}/api/history", params={"window": "hour"}, timeout=60).json()
        assert hour["window"] == "hour" and hour["bucket_seconds"] == 60
        assert [tuple(b.values()) for b in hour["buckets"]] == [
            (floor(early, 60), "faturar", 2, 1, 0),
            (floor(late, 60), "enviar", 0, 1, 1),
        ]
        day = web.get(f"{base}/api/history", params={"window": "day"}, timeout=60).json()
        assert day["bucket_seconds"] == 900
        assert [tuple(b.values()) for b in day["buckets"]] == [
            (floor(old, 900), "enviar", 1, 0, 0),
            (floor(early, 900), "faturar", 2, 1, 0),
            (floor(late, 900), "enviar", 0, 1, 1),
        ]
        bad = web.get(f"{base}/api/history", params={"window": "week"}, timeout=10)
        assert bad.status_code == 400 and "hour, day" in bad.json()["error"]
        # the overview draws the hour on its first load: axes, time labels,
        # counts, a legend below the plot
        overview = web.get(f"{base}/", timeout=60).text
        svg = chart_of(overview)
        assert "attempts finished per minute, last hour" in svg
        assert {"succeeded", "failed", "cancelled"} <= set(re.findall(r'data-series="(\w+)"', svg))
        assert re.search(r">succeeded \(2\)</text>", svg) and re.search(r">failed \(2\)<", svg)
        labels = re.findall(r'class="tick x"[^>]*>([^<]+)<', svg)
        assert len(labels) == 6 and all(re.fullmatch(r"\d\d:\d\d", label) for label in labels)
        assert re.findall(r'class="tick y"[^>]*>(\d+)<', svg) == ["0", "1", "2"]
        assert peaks(svg, "succeeded") == 1  # one minute's line rises, the rest lie on 0
        day_page = chart_of(web.get(f"{base}/", params={"window": "day"}, timeout=60).text)
        assert "per 15 min, last day" in day_page and ">succeeded (3)<" in day_page
        # the chart alone, for the page's refresh
        alone = web.get(f"{base}/chart.svg", params={"window": "hour"}, timeout=60)
        assert alone.headers["content-type"].startswith("image/svg+xml")
        assert alone.text.startswith('<svg xmlns="http://www.w3.org/2000/svg"')


def test_history_reads_again_a_range_whose_task_finished_since(
    engine: Engine, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history skips the id ranges with no recent finish, yet a task of
    an old range that finishes now is counted (its range's open count
    changed): ranges of 2 ids here, as of 65,536 in production."""
    monkeypatch.setattr(status_counts, "CHUNK_IDS", 2)
    status_counts.forget_all()
    table = app.Task.__table__
    long_ago = utcnow() - dt.timedelta(days=3)
    with engine.begin() as conn:
        ids = QueueClient(conn, app.Task).insert_tasks(
            [{"processo": "faturar", "payload": {}} for _ in range(12)]
        )
        done = update(table).where(table.c.id.in_(ids[1:]))
        conn.execute(done.values(status="sucesso", finished_at=long_ago))
    try:
        assert finished_history(engine, table, window="hour").buckets == []
        queries = adapter_of(engine.dialect, table).inspection
        with engine.connect() as conn:
            since = utcnow() - dt.timedelta(hours=1)
            read = status_counts.ranges_finished_since(conn, queries, since=since, now=utcnow())
        assert len(read) == 1 and read[0][0] > ids[0]  # the newest ranges only
        now = utcnow()
        with engine.begin() as conn:
            first = update(table).where(table.c.id == ids[0])
            conn.execute(first.values(status="falha", mensagem="boom", finished_at=now))
        found = finished_history(engine, table, window="hour").buckets
        assert [(b.at.isoformat(), b.process, b.succeeded, b.failed) for b in found] == [
            (floor(now, 60), "faturar", 0, 1)
        ]
    finally:
        status_counts.forget_all()


def test_the_workers_page_lists_the_workers_holding_tasks(engine: Engine, app: App) -> None:
    table = app.Task.__table__
    now = utcnow()
    with engine.begin() as conn:
        ids = QueueClient(conn, app.Task).insert_tasks(
            [{"processo": "faturar", "payload": {}} for _ in range(3)]
        )
        for task_id, worker in zip(ids, ("host-a:11", "host-a:11", "host-b:7"), strict=True):
            conn.execute(
                update(table)
                .where(table.c.id == task_id)
                .values(
                    status="processando",
                    worker_id=worker,
                    started_at=now,
                    lease_expires_at=now + dt.timedelta(seconds=60),
                )
            )
    with serving(engine, app, lease_seconds=60) as base:
        assert requests.get(f"{base}/workers", timeout=10, allow_redirects=False).status_code == 303
        web, _ = logged_in(base)
        html = web.get(f"{base}/workers", timeout=30).text
        assert 'id="nav-workers"' in html and 'id="nav-processes"' in html
        rows = re.findall(r"<tr><td>([^<]+)</td><td class=\"n\">(\d+)</td><td>([^<]+)</td>", html)
        assert [(w, n) for w, n, _ in rows] == [("host-a:11", "2"), ("host-b:7", "1")]
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", at) for _, _, at in rows)
    with engine.begin() as conn:
        conn.execute(update(table).values(status="pendente", worker_id=None))
    with serving(engine, app, read_only=True, password=None) as base:
        assert 'id="none"' in requests.get(f"{base}/workers", timeout=30).text


def test_the_processes_page_shows_counts_limits_and_pauses(engine: Engine, app: App) -> None:
    class Limited(app.RecordingWorker):  # type: ignore[name-defined,misc]
        concurrency_limits: ClassVar[dict[str, int]] = {"faturar": 3}
        rate_limits: ClassVar[dict[str, float]] = {"enviar": 2.5}

    with engine.begin() as conn:
        QueueClient(conn, app.Task).insert_tasks(
            [{"processo": p, "payload": {}} for p in ("faturar", "faturar", "enviar")]
        )
    finished(engine, app, [("enviar", "falha", "boom", utcnow())])
    with serving(engine, app, worker=Limited) as base:
        web, _ = logged_in(base)
        html = web.get(f"{base}/processes", timeout=30).text
        rows = dict(re.findall(r'<tr data-process="(\w+)">(.*?)</tr>', html, re.S))
        assert set(rows) == {"enviar", "faturar"}
        cells = {name: re.findall(r'<td class="n">([^<]*)</td>', row) for name, row in rows.items()}
        # ready ... dead_letter, finished in the window, failure rate, limits
        assert cells["faturar"] == ["2", "0", "0", "0", "0", "0", "0", "0", "0", "-", "3", "-"]
        assert cells["enviar"] == [
            "1",
            "0",
            "0",
            "0",
            "0",
            "1",
            "0",
            "0",
            "1",
            "100.0%",
            "-",
            "2.5/s",
        ]
        assert "paused" not in rows["faturar"].split("</td>")[1]
        csrf = CSRF.search(html)
        assert csrf
        paused = web.post(
            f"{base}/api/processes/pause",
            data={"csrf": csrf.group(1), "process": "faturar", "back": "processes"},
            timeout=30,
        )
        assert paused.status_code == 200 and paused.url.endswith("/processes?done=pause")
        again = dict(re.findall(r'<tr data-process="(\w+)">(.*?)</tr>', paused.text, re.S))
        assert '<span class="paused">paused</span>' in again["faturar"]
        assert 'class="resume" data-process="faturar"' in again["faturar"]


def test_bulk_actions_act_on_a_selection_or_a_filter(
    engine: Engine, app: App, installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = dead_task(engine, app, {"n": 1})
    with engine.begin() as conn:
        waiting = QueueClient(conn, app.Task).insert_tasks(
            [{"processo": "relatorio", "payload": {"n": n}} for n in range(5)]
        )
    with serving(engine, app, read_only=True, password=None) as base:
        refused = requests.post(f"{base}/api/tasks/bulk/cancel", json={"ids": waiting}, timeout=30)
        assert refused.status_code == 403
    with serving(engine, app) as base:
        web, csrf = logged_in(base)
        headers = {"X-CSRF-Token": csrf}
        url = f"{base}/api/tasks/bulk"
        assert web.post(f"{url}/cancel", json={"ids": waiting}, timeout=30).status_code == 403
        bad = web.post(f"{url}/cancel", json={"ids": ["x"]}, headers=headers, timeout=30)
        assert bad.status_code == 400 and "error" in bad.json()
        both = web.post(f"{url}/cancel", json={"ids": [], "filter": {}}, headers=headers)
        assert both.status_code == 400
        # a selection: each id's outcome
        picked = [waiting[0], waiting[1], dead, 10**12]
        answer = web.post(f"{url}/cancel", json={"ids": picked}, headers=headers, timeout=30)
        body = answer.json()
        assert (body["action"], body["done"], body["refused"], body["more"]) == (
            "cancel",
            2,
            2,
            False,
        )
        outcomes = {r["id"]: (r["outcome"], r.get("error", "")) for r in body["results"]}
        assert outcomes[waiting[0]] == ("done", "") and outcomes[waiting[1]] == ("done", "")
        assert outcomes[dead][0] == "refused" and outcomes[10**12][0] == "refused"
        assert "no task" in outcomes[10**12][1]
        # a filter: every ready task of a process, the newest up to the bound
        monkeypatch.setattr("sqla_queue.ops.dashboard.app.BULK_MAX", 2)
        matched = web.post(
            f"{url}/cancel",
            json={"filter": {"state": "ready", "process": "relatorio"}},
            headers=headers,
            timeout=30,
        ).json()
        assert [r["id"] for r in matched["results"]] == [waiting[4], waiting[3]]
        assert matched["done"] == 2 and matched["more"] is True
        # requeue from the page's form: the dead task gets a new chain
        page = web.get(f"{base}/tasks", params={"state": "dead_letter"}, timeout=30).text
        token = CSRF.search(page)
        listed = re.findall(r'name="ids" value="(\d+)"', page)  # the dead-letter run
        assert token and len(listed) == 1 and 'id="bulk-requeue"' in page
        done = web.post(f"{url}/requeue", data={"csrf": token.group(1), "ids": listed}, timeout=30)
        assert done.status_code == 200 and '<span id="bulk-done">1</span>' in done.text
        assert "new chain" in done.text
        states = web.get(f"{base}/api/tasks", params={"state": "cancelled"}, timeout=30).json()
        assert sorted(t["id"] for t in states["tasks"]) == sorted(
            [waiting[0], waiting[1], waiting[3], waiting[4]]
        )


def wrong_shapes(task: int) -> list[Any]:
    """Bulk bodies of the wrong shape, for JSON, around a waiting ``task``."""
    return [
        [task],
        str(task),
        task,
        None,
        {},
        {"ids": [task], "filter": {}},
        {"ids": [task], "dry_run": True},
        {"ids": str(task)},
        {"ids": {"id": task}},
        # ids that are not JSON integers, or no task's
        {"ids": [str(task)]},
        {"ids": [float(task)]},
        {"ids": [True]},
        {"ids": [None]},
        {"ids": [[task]]},
        {"ids": [{"id": task}]},
        {"ids": [task, 2**70]},
        {"ids": [task, 2**63]},
        {"ids": [task, -task]},
        {"ids": [task, 0]},
        {"ids": [task] * 1001},  # over the bound of 1,000
        # filters of the wrong types, or with a key no filter has
        {"filter": []},
        {"filter": "state=ready"},
        {"filter": {"state": 1}},
        {"filter": {"state": ["ready"]}},
        {"filter": {"state": "nope"}},
        {"filter": {"process": ["relatorio"]}},
        {"filter": {"process": 5}},
        {"filter": {"process": {"$ne": ""}}},
        {"filter": {"external_key": True}},
        {"filter": {"min_id": str(task)}},
        {"filter": {"min_id": task + 0.5}},
        {"filter": {"max_id": 2**70}},
        {"filter": {"max_id": -1}},
        {"filter": {"proces": "relatorio"}},  # misspelt: it would match every task
        {"filter": {"process": "relatorio", "after": task}},
    ]


def test_garbage_bulk_bodies_answer_4xx_and_change_nothing(
    engine: Engine, app: App, installed: None
) -> None:
    """Each answers 4xx with one line of JSON, before touching a row; the
    server serves on."""
    dead_task(engine, app, {"n": 1})
    with engine.begin() as conn:
        waiting = QueueClient(conn, app.Task).insert_tasks(
            [{"processo": "relatorio", "payload": {"n": n}} for n in range(3)]
        )
    before = rows_of(engine, app)
    with serving(engine, app) as base:
        web, csrf = logged_in(base)
        url = f"{base}/api/tasks/bulk"
        token = {"X-CSRF-Token": csrf}
        as_json = {**token, "Content-Type": "application/json"}
        ten_mb = 10 * 1024 * 1024
        many_ids = b'{"ids": [' + b"1," * (ten_mb // 2) + b"1]}"
        sent: list[tuple[str, Any, dict[str, str]]] = [
            ("cancel", b"not json", as_json),
            ("cancel", b"\xff\xfe\x00garbage", as_json),
            ("cancel", b'{"ids": [1, 2', as_json),  # cut short
            ("cancel", b'{"ids": [NaN]}', as_json),
            ("cancel", b"[" * 100_000, as_json),  # nested deeper than the parser goes
            ("cancel", str(waiting[0]).encode(), token),  # no Content-Type
            ("cancel", f"ids={waiting[0]}".encode(), {**token, "Content-Type": "text/plain"}),
            ("cancel", many_ids, as_json),  # 10 MB, its length given
            ("cancel", (many_ids[i : i + 65536] for i in range(0, len(many_ids), 65536)), as_json),
            ("cancel", b"[" * ten_mb, as_json),
            ("requeue", {"ids": [str(waiting[0])] * 1001}, token),  # a form over 1,000 fields
            ("explode", json.dumps({"ids": [waiting[0]]}).encode(), as_json),
        ]
        for shape in wrong_shapes(waiting[0]):
            body = json.dumps(shape).encode()
            sent += [(action, body, as_json) for action in ("cancel", "retry-now")]
        for action, body, headers in sent:
            answer = web.post(f"{url}/{action}", data=body, headers=headers, timeout=120)
            shown = body[:80] if isinstance(body, bytes) else type(body).__name__
            assert 400 <= answer.status_code < 500, (shown, answer.status_code, answer.text[:200])
            assert answer.headers["content-type"] == "application/json", (shown, answer.text)
            assert "\n" not in answer.text, shown
            error = answer.json()
            assert list(error) == ["error"] and isinstance(error["error"], str), shown
        assert rows_of(engine, app) == before
        # it serves on: a read, and a bulk action that acts
        assert web.get(f"{base}/api/status", timeout=30).status_code == 200
        done = web.post(f"{url}/cancel", json={"ids": [waiting[0]]}, headers=token, timeout=30)
        assert done.status_code == 200 and done.json()["done"] == 1


def rows_of(engine: Engine, app: App) -> list[Any]:
    """Every row of the queue table, every column, by id."""
    table = app.Task.__table__
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(select(table).order_by(table.c.id))]


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_browser_clicks_through_the_views_and_requeues_in_bulk(
    engine: Engine, app: App, installed: None, browser: Any
) -> None:
    dead_task(engine, app, {"n": 1})
    finished(engine, app, [("enviar", "sucesso", SUCCESS_MESSAGE, utcnow())])
    with serving(engine, app) as base:
        browser.delete_all_cookies()
        log_in(browser, base)
        # the chart is there on load, with its legend and axes
        # (the dead-letter run's attempt succeeded: an attempt of its own)
        assert browser.find_element(By.ID, "legend-succeeded").text == "succeeded (2)"
        assert browser.find_element(By.ID, "legend-failed").text == "failed (1)"
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart polyline")) == 3
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart text.tick.x")) == 6
        browser.find_element(By.LINK_TEXT, "Tasks").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "tasks"))
        first = browser.find_element(By.CSS_SELECTOR, "#tasks tbody tr td a")
        task_id = first.text
        first.click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "timeline"))
        assert browser.current_url.endswith(f"/tasks/{task_id}")
        browser.find_element(By.ID, "nav-workers").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "running-tasks"))
        assert browser.find_element(By.ID, "none").text == "No worker holds a task."
        browser.find_element(By.ID, "nav-processes").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "processes"))
        names = [
            row.get_attribute("data-process")
            for row in browser.find_elements(By.CSS_SELECTOR, "#processes tbody tr")
        ]
        assert names == ["enviar", "faturar"]
        browser.back()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "running-tasks"))
        # the filter form, chosen and submitted by clicking: a state, then a
        # process, then both
        browser.find_element(By.LINK_TEXT, "Tasks").click()
        arrived(browser, "/tasks", "filters")
        assert len(shown_tasks(browser)) == 3  # the chain, its dead-letter run, enviar's
        Select(browser.find_element(By.ID, "state-filter")).select_by_value("succeeded")
        browser.find_element(By.ID, "filter").click()
        arrived(browser, "state=succeeded", "tasks")
        assert shown_tasks(browser) == [("enviar", "succeeded")]
        Select(browser.find_element(By.ID, "state-filter")).select_by_value("")
        browser.find_element(By.ID, "process-filter").send_keys("faturar")
        browser.find_element(By.ID, "filter").click()
        arrived(browser, "state=&process=faturar", "tasks")
        assert sorted(shown_tasks(browser)) == [("faturar", "dead_letter"), ("faturar", "failed")]
        Select(browser.find_element(By.ID, "state-filter")).select_by_value("dead_letter")
        browser.find_element(By.ID, "filter").click()
        arrived(browser, "state=dead_letter&process=faturar", "tasks")
        assert shown_tasks(browser) == [("faturar", "dead_letter")]
        # a bulk requeue of the ticked dead-letter run
        browser.find_element(By.CSS_SELECTOR, "#tasks input.pick").click()
        browser.find_element(By.ID, "bulk-requeue").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "bulk-results"))
        assert browser.find_element(By.ID, "bulk-done").text == "1"
        assert browser.find_element(By.ID, "bulk-refused").text == "0"
        browser.find_element(By.ID, "back-to-tasks").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "tasks"))
        states = [
            cell.text
            for cell in browser.find_elements(By.CSS_SELECTOR, "#tasks tbody td:nth-child(5)")
        ]
        assert "ready" in states  # the requeued task's new chain
        # a pause by clicking, on the page and in the database; and a resume
        browser.find_element(By.ID, "nav-processes").click()
        arrived(browser, "/processes", "processes")
        browser.find_element(By.CSS_SELECTOR, "button.pause[data-process='faturar']").click()
        arrived(browser, "/processes?done=pause", "notice")
        row = browser.find_element(By.CSS_SELECTOR, "#processes tr[data-process='faturar']")
        assert row.find_element(By.CSS_SELECTOR, "td:nth-child(2)").text == "paused"
        assert paused_in(engine, app) == {"faturar"}
        browser.find_element(By.CSS_SELECTOR, "button.resume[data-process='faturar']").click()
        arrived(browser, "/processes?done=resume", "notice")
        row = browser.find_element(By.CSS_SELECTOR, "#processes tr[data-process='faturar']")
        assert row.find_element(By.CSS_SELECTOR, "td:nth-child(2)").text == "no"
        assert browser.find_elements(By.CSS_SELECTOR, "button.pause[data-process='faturar']")
        assert paused_in(engine, app) == set()


def arrived(browser: Any, url_part: str, element_id: str) -> None:
    """Wait (30 s at most) for the page a click led to: its URL holds
    ``url_part``, it has loaded, and it has the element ``element_id``."""
    WebDriverWait(browser, 30).until(
        lambda d: (
            url_part in d.current_url
            and d.execute_script("return document.readyState") == "complete"
            and d.find_elements(By.ID, element_id)
        )
    )


def shown_tasks(browser: Any) -> list[tuple[str, str]]:
    """The task browser's rows: (process, state) each."""
    return [
        (
            row.find_element(By.CSS_SELECTOR, "td:nth-child(4)").text,
            row.find_element(By.CSS_SELECTOR, "td:nth-child(5)").text,
        )
        for row in browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")
    ]


def paused_in(engine: Engine, app: App) -> set[str]:
    """The processes paused, as the database says."""
    with engine.connect() as conn:
        return set(paused_processes(conn, app.Task))


def chart_of(page: str) -> str:
    found = re.search(r'<svg xmlns="http://www.w3.org/2000/svg" id="chart".*?</svg>', page, re.S)
    assert found, page
    return found.group(0)


def peaks(svg: str, series: str) -> int:
    """How many of ``series``' points lie above the x axis."""
    points: Any = re.search(rf'data-series="{series}" points="([^"]+)"', svg)
    bottom = re.search(r'class="axis" x1="\d+" y1="([\d.]+)"', svg)
    assert points and bottom
    ys = [float(p.split(",")[1]) for p in points.group(1).split()]
    return sum(1 for y in ys if y < float(bottom.group(1)))
