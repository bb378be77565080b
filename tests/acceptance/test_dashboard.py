"""The web dashboard in a real headless browser (Debian's chromium, driven by
Selenium through Debian's chromedriver; nothing downloads a browser), and
its HTTP API from a plain client: pages render, a dead task is requeued
from the page and then runs, writes without a login (or without a
configured credential) are refused, CSRF is checked, a hostile task message
is shown escaped, and garbage requests leave the server serving."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_queue.dashboard import DashboardConfig, create_app
from sqla_queue.inspect import queue_status
from sqla_queue.testing import run_until_empty
from tests.conftest import wait_until
from tests.support.app import App

PASSWORD = "s3cret-dashboard-pass"
HOSTILE = '<script>window.hacked=1</script><img src=x onerror="window.hacked=2">'
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(engine: Engine, app: App, password: str | None = PASSWORD) -> Iterator[str]:
    """The dashboard on a free port of 127.0.0.1, in a thread; its base URL."""
    web = create_app(engine, app.Task, config=DashboardConfig(password=password))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=30, message="the dashboard to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def dead_task(engine: Engine, app: App, payload: Any) -> int:
    """A task that spent its attempts and ran its dead-letter run; its id."""

    class Failing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            raise RuntimeError(str(payload.get("say", "failed on purpose")))

    with Session(engine) as session:
        task = app.Task(process="faturar", payload=payload)
        session.add(task)
        session.flush()
        task_id = int(task.id)
        assert run_until_empty(Failing, session).dead == 1
        session.commit()
    return task_id


def log_in(browser: Any, base: str) -> None:
    browser.get(f"{base}/login")
    browser.find_element(By.ID, "username").send_keys("admin")
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "logout"))


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_dead_task_is_requeued_from_the_page_and_then_runs(
    engine: Engine, app: App, installed: None, browser: Any
) -> None:
    task_id = dead_task(engine, app, {"n": 1})
    with serving(engine, app) as base:
        browser.delete_all_cookies()
        browser.get(f"{base}/")
        assert browser.find_element(By.ID, "counts")
        # the chart is drawn by the page's script from /api/status
        WebDriverWait(browser, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#chart polyline")
        )
        browser.get(f"{base}/dead")
        button = browser.find_element(By.CSS_SELECTOR, f"button.requeue[data-task='{task_id}']")
        assert not button.is_enabled()  # not logged in
        log_in(browser, base)
        browser.get(f"{base}/dead")
        browser.find_element(By.CSS_SELECTOR, f"button.requeue[data-task='{task_id}']").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "notice"))
        new_id = int(re.search(r"/tasks/(\d+)", browser.current_url).group(1))  # type: ignore[union-attr]
        assert new_id != task_id
        # the requeued task runs (a worker whose handler now succeeds)
        with Session(engine) as session:
            assert run_until_empty(app.RecordingWorker, session).succeeded == 1
            session.commit()
        browser.get(f"{base}/tasks/{task_id}")
        kinds = [
            row.get_attribute("class")
            for row in browser.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")
        ]
        assert kinds == ["attempt", "dead_letter", "requeued"]
        browser.get(f"{base}/tasks/{new_id}")
        assert browser.find_element(By.ID, "state").text == "failed"  # the family's own chain
        rows = browser.find_elements(By.CSS_SELECTOR, "#timeline tr.requeued td")
        assert "sucesso" in [cell.text for cell in rows]
        # a second requeue of the same dead task is refused
        browser.get(f"{base}/dead")
        assert not browser.find_elements(By.CSS_SELECTOR, f"button.requeue[data-task='{task_id}']")


def test_a_hostile_task_message_is_shown_escaped(
    engine: Engine, app: App, installed: None, browser: Any
) -> None:
    task_id = dead_task(engine, app, {"say": HOSTILE})
    with serving(engine, app) as base:
        for path in (f"/tasks/{task_id}", "/", "/dead"):
            browser.get(f"{base}{path}")
            assert browser.execute_script("return window.hacked") is None
            assert not browser.find_elements(By.CSS_SELECTOR, "main img")
            if path != "/dead":  # the dead-letter run's message is its own handler's
                shown = browser.find_element(By.TAG_NAME, "main").text
                assert "<script>window.hacked=1</script>" in shown


def test_writes_need_a_login_a_csrf_token_and_a_configured_credential(
    engine: Engine, app: App, installed: None
) -> None:
    task_id = dead_task(engine, app, {"n": 2})
    with serving(engine, app, password=None) as base:
        refused = requests.post(f"{base}/api/tasks/{task_id}/requeue", timeout=10)
        assert refused.status_code == 403
        page = requests.get(f"{base}/", timeout=10).text
        assert "set SQLA_QUEUE_DASHBOARD_PASSWORD" in page
        assert requests.get(f"{base}/login", timeout=10).status_code == 403
    with serving(engine, app) as base:
        anonymous = requests.post(
            f"{base}/api/tasks/{task_id}/requeue", headers={"X-CSRF-Token": "x"}, timeout=10
        )
        assert anonymous.status_code == 401
        with requests.Session() as web:
            csrf = re.search(
                r'name="csrf" value="([^"]+)"', web.get(f"{base}/login", timeout=10).text
            )
            assert csrf
            wrong = web.post(
                f"{base}/login",
                data={"csrf": csrf.group(1), "username": "admin", "password": "nope"},
                timeout=10,
            )
            assert wrong.status_code == 401 and "nope" not in wrong.text
            login = web.post(
                f"{base}/login",
                data={"csrf": csrf.group(1), "username": "admin", "password": PASSWORD},
                timeout=10,
                allow_redirects=False,
            )
            assert login.status_code == 303
            cookie_header = login.headers["set-cookie"].lower()
            assert "httponly" in cookie_header and "samesite=strict" in cookie_header
            token = re.search(r'name="csrf" value="([^"]+)"', web.get(f"{base}/", timeout=10).text)
            assert token and token.group(1) != csrf.group(1)  # a new token at login
            no_token = web.post(f"{base}/api/tasks/{task_id}/requeue", timeout=10)
            assert no_token.status_code == 403
            bad_token = web.post(
                f"{base}/api/tasks/{task_id}/requeue",
                headers={"X-CSRF-Token": "forged"},
                timeout=10,
            )
            assert bad_token.status_code == 403
            done = web.post(
                f"{base}/api/tasks/{task_id}/requeue",
                headers={"X-CSRF-Token": token.group(1)},
                timeout=10,
            )
            assert done.status_code == 200 and done.json()["ok"] is True
            again = web.post(
                f"{base}/api/tasks/{task_id}/requeue",
                headers={"X-CSRF-Token": token.group(1)},
                timeout=10,
            )
            assert again.status_code == 409
            # pause and resume a process from the API (the page's forms post the same)
            paused = web.post(
                f"{base}/api/processes/pause",
                data={"process": "faturar"},
                headers={"X-CSRF-Token": token.group(1)},
                timeout=10,
            )
            assert paused.status_code == 200 and paused.json()["paused"] == ["faturar"]
            assert web.get(f"{base}/api/status", timeout=10).json()["paused"] == ["faturar"]
            assert "Resume faturar" in web.get(f"{base}/", timeout=10).text
            no_token = web.post(f"{base}/api/processes/resume", data={"process": "faturar"})
            assert no_token.status_code == 403
            resumed = web.post(
                f"{base}/api/processes/resume",
                data={"process": "faturar"},
                headers={"X-CSRF-Token": token.group(1)},
                timeout=10,
            )
            assert resumed.json()["paused"] == []
            cookie = web.cookies.get("sqla_queue_dashboard")
            assert cookie and PASSWORD not in cookie
        headers = requests.get(f"{base}/", timeout=10).headers
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"


def test_api_status_is_the_status_json_on_every_database(
    engine: Engine, app: App, installed: None
) -> None:
    dead_task(engine, app, {"n": 3})
    with Session(engine) as session:
        session.add_all([app.Task(process="relatorio", payload={"n": n}) for n in range(3)])
        session.commit()
    with serving(engine, app) as base:
        served = requests.get(f"{base}/api/status", timeout=10).json()
    expected = queue_status(engine, app.Task).as_json()
    for key in ("queue", "processes", "totals"):
        assert served[key] == expected[key]


def test_garbage_requests_leave_the_server_serving(engine: Engine, app: App) -> None:
    with serving(engine, app) as base:
        assert requests.get(f"{base}/tasks/abc", timeout=10).status_code == 404
        assert requests.get(f"{base}/tasks/987654321", timeout=10).status_code == 404
        assert requests.post(f"{base}/api/tasks/1/explode", timeout=10).status_code in (401, 404)
        assert requests.get(f"{base}/{'x' * 10000}", timeout=10).status_code in (404, 414, 431)
        host, port = base.removeprefix("http://").split(":")
        for garbage in (
            b"\x00\xff" * 500,
            b"GET / HTTP/9.9\r\n\r\n",
            b"POST /login HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nx",
        ):
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(garbage)
                with contextlib.suppress(OSError):
                    raw.recv(1024)
        assert requests.get(f"{base}/api/status", timeout=10).status_code == 200
