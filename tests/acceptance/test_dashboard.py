"""The web dashboard in a real headless browser (Debian's chromium, driven by
Selenium through Debian's chromedriver; nothing downloads a browser), and
its HTTP API from a plain client on a real uvicorn: every page needs a
login (unless read-only), a dead task is requeued from the page and then
runs, a logout ends the session for good, CSRF is checked, failed logins
are throttled, a foreign Host header is refused, webhook URLs are masked,
hostile task text is shown escaped, and garbage requests (huge task ids
included) leave the server serving."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
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

from sqla_queue.common.exceptions import ConfigurationError
from sqla_queue.ops.dashboard import DashboardConfig, create_app
from sqla_queue.ops.dashboard.app import COOKIE
from sqla_queue.ops.status import queue_status
from sqla_queue.testing import run_until_empty
from sqla_queue.worker.base import WorkerBase
from tests.acceptance.test_concurrency import RECORDING, spawned, worker_env
from tests.conftest import run_cli, wait_until
from tests.support.app import App

PASSWORD = "s3cret-dashboard-pass"
HOSTILE = '<script>window.hacked=1</script><img src=x onerror="window.hacked=2">'
#: a window title (OSC 0), a hidden link (OSC 8), a bell, a C1 CSI, a bidi override
CONTROLS = (
    "\x1b]0;owned\x07 \x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\ \x9b2J \u202etxt.exe"
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
HUGE = str(2**63)
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Clock:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def serving(
    engine: Engine,
    model: Any,
    *,
    clock: Callable[[], float] | None = None,
    subscriber_model: Any = None,
    tls: tuple[Path, Path] | None = None,
    worker: Any = None,
    **config: Any,
) -> Iterator[str]:
    """The dashboard on a free port of 127.0.0.1, in a thread; its base URL.
    ``config``: DashboardConfig's fields (the password is PASSWORD unless
    given); ``tls``: a certificate and its key (HTTPS)."""
    config.setdefault("password", PASSWORD)
    options: dict[str, Any] = {} if clock is None else {"clock": clock}
    if worker is not None:
        options["worker"] = worker
    web = create_app(
        engine,
        model.Task if hasattr(model, "Task") else model,
        subscriber_model=subscriber_model,
        config=DashboardConfig(**config),
        **options,
    )
    port = free_port()
    certificate: dict[str, Any] = {}
    if tls is not None:
        certificate = {"ssl_certfile": str(tls[0]), "ssl_keyfile": str(tls[1])}
    server = uvicorn.Server(
        uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning", **certificate)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=30, message="the dashboard to listen")
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (Debian's openssl)."""
    certificate, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(certificate)],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return certificate, key


def login_form(web: requests.Session, base: str) -> str:
    """The login form's CSRF token (the form starts an anonymous session)."""
    found = CSRF.search(web.get(f"{base}/login", timeout=10).text)
    assert found
    return found.group(1)


def try_login(web: requests.Session, base: str, csrf: str, password: str) -> requests.Response:
    return web.post(
        f"{base}/login",
        data={"csrf": csrf, "username": "admin", "password": password},
        timeout=10,
        allow_redirects=False,
    )


def cookie_of(response: Any) -> str:
    """The session id a response sets."""
    found = re.search(rf"{COOKIE}=([^;]+)", response.headers["set-cookie"])
    assert found
    return found.group(1)


def logged_in(base: str, password: str = PASSWORD) -> tuple[requests.Session, str]:
    """A client logged in to ``base``, and its session's CSRF token."""
    web = requests.Session()
    done = try_login(web, base, login_form(web, base), password)
    assert done.status_code == 303, done.text
    token = CSRF.search(web.get(f"{base}/", timeout=10).text)
    assert token
    return web, token.group(1)


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


def dead_task(engine: Engine, app: App, payload: Any, *, default_dead: bool = False) -> int:
    """A task that spent its attempts and ran its dead-letter run; its id.
    ``default_dead``: the run is WorkerBase's own (its stored text), not
    the recording worker's ("dead handled")."""

    class Failing(app.RecordingWorker):  # type: ignore[name-defined,misc]
        max_retry = 1

        def execute(self, payload: Any, task: Any, session: Any) -> str | None:
            raise RuntimeError(str(payload.get("say", "failed on purpose")))

    if default_dead:
        Failing.execute_dead = WorkerBase.execute_dead  # type: ignore[method-assign]

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


# ------------------------------------------------------------ in the browser
@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_dead_task_is_requeued_from_the_page_and_then_runs(
    engine: Engine, app: App, installed: None, browser: Any
) -> None:
    task_id = dead_task(engine, app, {"n": 1})
    with serving(engine, app) as base:
        browser.delete_all_cookies()
        browser.get(f"{base}/dead")
        assert browser.current_url == f"{base}/login"  # no page without a login
        log_in(browser, base)
        assert browser.find_element(By.ID, "counts")
        # the chart is drawn by the page's script from /api/status
        WebDriverWait(browser, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#chart polyline")
        )
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
        # the requeued task's page: its own chain's state, not its family's
        assert browser.find_element(By.ID, "state").text == "succeeded"
        rows = browser.find_elements(By.CSS_SELECTOR, "#timeline tr.requeued td")
        assert "succeeded" in [cell.text for cell in rows]
        assert browser.find_element(By.ID, "payload").text.startswith("{")
        # a second requeue of the same dead task is refused
        browser.get(f"{base}/dead")
        assert not browser.find_elements(By.CSS_SELECTOR, f"button.requeue[data-task='{task_id}']")


def test_a_logout_in_the_browser_ends_the_session_for_good(
    engine: Engine, app: App, browser: Any
) -> None:
    with serving(engine, app) as base:
        browser.delete_all_cookies()
        log_in(browser, base)
        browser.get(f"{base}/dead")
        assert browser.find_element(By.TAG_NAME, "h2").text == "Dead letter"
        cookie = browser.get_cookie(COOKIE)
        assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert not cookie["secure"]  # plain HTTP
        assert PASSWORD not in cookie["value"]
        browser.find_element(By.ID, "logout").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "login-form"))
        assert browser.find_element(By.ID, "notice").text == "Logged out."
        # the old cookie, put back in the browser, opens nothing
        browser.delete_all_cookies()
        browser.add_cookie({"name": COOKIE, "value": cookie["value"], "path": "/"})
        browser.get(f"{base}/dead")
        assert browser.current_url == f"{base}/login"
        # nor from another client
        replayed = requests.get(f"{base}/api/status", cookies={COOKIE: cookie["value"]}, timeout=10)
        assert replayed.status_code == 401


def test_hostile_task_text_is_shown_escaped(
    engine: Engine, app: App, installed: None, browser: Any
) -> None:
    task_id = dead_task(engine, app, {"say": HOSTILE + CONTROLS})
    with Session(engine) as session:
        session.add(app.Task(process="fatur\u202eevil\x1b[2J", payload={"n": 1}))
        session.commit()
    with serving(engine, app) as base:
        browser.delete_all_cookies()
        log_in(browser, base)
        for path in (f"/tasks/{task_id}", "/", "/dead"):
            browser.get(f"{base}{path}")
            if path == "/":  # the counts table, redrawn by the page's script
                WebDriverWait(browser, 30).until(
                    lambda d: d.find_elements(By.CSS_SELECTOR, "#chart polyline")
                )
            assert browser.execute_script("return window.hacked") is None
            assert not browser.find_elements(By.CSS_SELECTOR, "main img")
            shown = browser.find_element(By.TAG_NAME, "main").text
            for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
                assert raw not in shown, (path, raw)
            if path != "/dead":  # the dead-letter run's message is its own handler's
                assert "<script>window.hacked=1</script>" in shown
                assert "\\x1b]0;owned\\x07" in shown and "\\x9b2J \\u202etxt.exe" in shown
            if path == "/":
                assert "fatur\\u202eevil\\x1b[2J" in shown


# ------------------------------------------------------------ over HTTP
def test_every_read_and_write_needs_a_login_and_a_csrf_token(
    engine: Engine, app: App, installed: None
) -> None:
    task_id = dead_task(engine, app, {"n": 2})
    with serving(engine, app) as base:
        for path in ("/", "/dead", "/subscriptions", f"/tasks/{task_id}"):
            page = requests.get(f"{base}{path}", timeout=10, allow_redirects=False)
            assert page.status_code == 303 and page.headers["location"] == "/login", path
        for path in ("/api/status", f"/api/tasks/{task_id}"):
            assert requests.get(f"{base}{path}", timeout=10).status_code == 401, path
        anonymous = requests.post(
            f"{base}/api/tasks/{task_id}/requeue", headers={"X-CSRF-Token": "x"}, timeout=10
        )
        assert anonymous.status_code == 401
        with requests.Session() as web:
            csrf = login_form(web, base)
            forged = try_login(web, base, "forged", PASSWORD)
            assert forged.status_code == 403
            wrong = try_login(web, base, csrf, "nope")
            assert wrong.status_code == 401 and "nope" not in wrong.text
            login = try_login(web, base, csrf, PASSWORD)
            assert login.status_code == 303
            cookie_header = login.headers["set-cookie"].lower()
            assert "httponly" in cookie_header and "samesite=strict" in cookie_header
            assert "secure" not in cookie_header  # plain HTTP, no TLS proxy said
            token = CSRF.search(web.get(f"{base}/", timeout=10).text)
            assert token and token.group(1) != csrf  # a new session and token at login
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
            cookie = web.cookies.get(COOKIE)
            assert cookie and PASSWORD not in cookie and len(cookie) >= 43  # 256 bits
        headers = requests.get(f"{base}/login", timeout=10).headers
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"


def test_read_only_mode_reads_without_a_login_and_refuses_every_write(
    engine: Engine, app: App, installed: None
) -> None:
    task_id = dead_task(engine, app, {"n": 3})
    # a password in the environment does not undo read-only mode
    for password in (None, PASSWORD):
        with serving(engine, app, read_only=True, password=password) as base:
            page = requests.get(f"{base}/dead", timeout=10)
            assert page.status_code == 200 and 'id="read-only"' in page.text
            assert re.search(rf'data-task="{task_id}"\s+disabled', page.text)
            assert requests.get(f"{base}/api/status", timeout=10).status_code == 200
            assert requests.get(f"{base}/api/tasks/{task_id}", timeout=10).status_code == 200
            assert requests.get(f"{base}/login", timeout=10).status_code == 403
            login = requests.post(
                f"{base}/login", data={"username": "admin", "password": PASSWORD}, timeout=10
            )
            assert login.status_code == 403
            for path in (f"/api/tasks/{task_id}/requeue", "/api/processes/pause"):
                refused = requests.post(
                    f"{base}{path}",
                    data={"process": "faturar"},
                    headers={"X-CSRF-Token": "x"},
                    timeout=10,
                )
                assert refused.status_code == 403, path
                assert "read-only" in refused.json()["error"]
    assert not queue_status(engine, app.Task).paused


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_a_password_or_read_only_mode_the_dashboard_does_not_start(
    engine: Engine, app: App, table_name: str, db_url: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"SQLA_QUEUE_DASHBOARD_PASSWORD.*--read-only"):
        create_app(engine, app.Task, config=DashboardConfig())
    with pytest.raises(ConfigurationError, match="not a host name"):
        create_app(engine, app.Task, config=DashboardConfig(read_only=True, allowed_hosts=("a/b",)))
    env = {
        **worker_env(table_name),
        "SQLA_QUEUE_DASHBOARD_PASSWORD": "",
        "SQLA_QUEUE_DASHBOARD_READ_ONLY": "",
    }
    for extra_env, args, expected in (
        ({}, (), "SQLA_QUEUE_DASHBOARD_PASSWORD"),
        ({"SQLA_QUEUE_DASHBOARD_READ_ONLY": "maybe"}, (), "SQLA_QUEUE_DASHBOARD_READ_ONLY"),
        ({}, ("--read-only", "--allowed-host", "evil/path"), "not a host name"),
    ):
        refused = run_cli(
            "dashboard", RECORDING, "--url", db_url, *args, env={**env, **extra_env}, check=False
        )
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("Error: ")
        assert expected in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_command_serves_read_only_or_behind_a_tls_proxy(
    engine: Engine, app: App, table_name: str, db_url: str
) -> None:
    port = free_port()
    env = {**worker_env(table_name), "SQLA_QUEUE_DASHBOARD_PASSWORD": ""}
    args = ("dashboard", RECORDING, "--url", db_url, "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    with spawned(*args, "--read-only", "--allowed-host", "dash.example", env=env) as (cli,):
        wait_until(lambda: "read-only, no login" in cli.output and listening(port), message="start")
        assert requests.get(f"{base}/api/status", timeout=10).status_code == 200
        for host, code in (("evil.example", 400), ("dash.example:8780", 200), ("[::1]", 200)):
            answer = requests.get(f"{base}/api/status", headers={"Host": host}, timeout=10)
            assert answer.status_code == code, host
        refused = requests.post(f"{base}/api/processes/pause", data={"process": "x"}, timeout=10)
        assert refused.status_code == 403
    env = {
        **env,
        "SQLA_QUEUE_DASHBOARD_PASSWORD": PASSWORD,
        "SQLA_QUEUE_DASHBOARD_BEHIND_TLS": "true",
        "SQLA_QUEUE_DASHBOARD_ALLOWED_HOSTS": "dash.example, other.example",
    }
    port = free_port()
    args = ("dashboard", RECORDING, "--url", db_url, "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    with spawned(*args, env=env) as (cli,):
        wait_until(lambda: "login required" in cli.output and listening(port), message="start")
        assert requests.get(f"{base}/api/status", timeout=10).status_code == 401
        form = requests.get(f"{base}/login", headers={"Host": "other.example"}, timeout=10)
        assert form.status_code == 200 and "secure" in form.headers["set-cookie"].lower()
        # a Secure cookie is not sent back over plain HTTP: send it by hand
        session_id, csrf = cookie_of(form), CSRF.search(form.text)
        assert csrf
        login = requests.post(
            f"{base}/login",
            data={"csrf": csrf.group(1), "username": "admin", "password": PASSWORD},
            headers={"Cookie": f"{COOKIE}={session_id}"},
            timeout=10,
            allow_redirects=False,
        )
        assert login.status_code == 303
        assert "secure" in login.headers["set-cookie"].lower()


def test_a_foreign_host_header_is_refused(engine: Engine, app: App) -> None:
    """DNS rebinding: a page of evil.example whose name now points at
    127.0.0.1 sends ``Host: evil.example``."""
    with serving(engine, app, allowed_hosts=("dash.example", "*.corp.example")) as base:
        port = base.rsplit(":", 1)[1]
        for path in ("/", "/subscriptions", "/login", "/api/status", "/static/app.js"):
            for host in ("evil.example", f"evil.example:{port}", "dash.example.evil.example"):
                answer = requests.get(f"{base}{path}", headers={"Host": host}, timeout=10)
                assert answer.status_code == 400, (path, host)
        for host in (
            f"127.0.0.1:{port}",
            "localhost",
            f"LOCALHOST:{port}",
            f"[::1]:{port}",
            "dash.example",
            f"a.corp.example:{port}",
        ):
            answer = requests.get(f"{base}/login", headers={"Host": host}, timeout=10)
            assert answer.status_code == 200, host


def test_webhook_urls_are_shown_masked(pengine: Engine, papp: Any) -> None:
    with Session(pengine) as session:
        session.add(
            papp.Subscriber(
                id="s1",
                process="faturar",
                url="https://user:pw@hooks.example.com/services/T0/B0/SECRETPATH?token=SECRETQ",
                signing_secret="SIGNINGSECRET",
                headers={"Authorization": "Bearer SECRETHEADER"},
            )
        )
        session.commit()
    with serving(pengine, papp, subscriber_model=papp.Subscriber) as base:
        web, _ = logged_in(base)
        page = web.get(f"{base}/subscriptions", timeout=10).text
        assert "https://hooks.example.com/***" in page
        for secret in ("SECRET", "user:pw"):
            assert secret not in page
        evil = requests.get(f"{base}/subscriptions", headers={"Host": "evil.example"}, timeout=10)
        assert evil.status_code == 400 and "hooks.example.com" not in evil.text


def test_failed_logins_are_throttled_and_the_lockout_ends(engine: Engine, app: App) -> None:
    clock = Clock()
    with serving(engine, app, clock=clock) as base, requests.Session() as web:
        csrf = login_form(web, base)
        codes = [try_login(web, base, csrf, f"guess-{n}").status_code for n in range(100)]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
        locked = try_login(web, base, csrf, PASSWORD)  # the right one, during the lockout
        assert locked.status_code == 429 and locked.headers["retry-after"] == "1"
        assert web.get(f"{base}/api/status", timeout=10).status_code == 401
        clock.now += 1.0
        assert try_login(web, base, csrf, "still-wrong").status_code == 401
        clock.now += 1.5  # the next lockout is twice as long
        assert try_login(web, base, csrf, PASSWORD).status_code == 429
        clock.now += 0.5
        assert try_login(web, base, csrf, PASSWORD).status_code == 303
        assert web.get(f"{base}/api/status", timeout=10).status_code == 200


def test_a_cookie_replayed_after_logout_is_refused(
    engine: Engine, app: App, installed: None
) -> None:
    task_id = dead_task(engine, app, {"n": 4})
    with serving(engine, app) as base:
        web, token = logged_in(base)
        cookie = web.cookies.get(COOKIE)
        assert web.get(f"{base}/api/status", timeout=10).status_code == 200
        bye = web.post(f"{base}/logout", data={"csrf": token}, timeout=10, allow_redirects=False)
        assert bye.status_code == 303 and bye.headers["location"] == "/login?done=logged-out"
        assert f"{COOKIE}=" in bye.headers["set-cookie"]  # the browser's copy is dropped
        replay = {COOKIE: str(cookie)}
        assert requests.get(f"{base}/api/status", cookies=replay, timeout=10).status_code == 401
        requeue = requests.post(
            f"{base}/api/tasks/{task_id}/requeue",
            cookies=replay,
            headers={"X-CSRF-Token": token},
            timeout=10,
        )
        assert requeue.status_code == 401
    assert queue_status(engine, app.Task).as_json()["totals"]["dead_letter"] == 1


def test_dashboards_never_accept_each_others_sessions(engine: Engine, app: App) -> None:
    """Two dashboards with the same secret (and even the same password), and
    a dashboard restarted with a new password: none accepts another's cookie."""
    shared = {"secret_key": "shared-secret"}
    with serving(engine, app, **shared) as a, serving(engine, app, **shared) as b:
        web, token = logged_in(a)
        replay = {COOKIE: str(web.cookies.get(COOKIE))}
        assert requests.get(f"{b}/api/status", cookies=replay, timeout=10).status_code == 401
        paused = requests.post(
            f"{b}/api/processes/pause",
            data={"process": "faturar"},
            cookies=replay,
            headers={"X-CSRF-Token": token},
            timeout=10,
        )
        assert paused.status_code == 401
        assert requests.get(f"{a}/api/status", cookies=replay, timeout=10).status_code == 200
    with serving(engine, app, password="a-new-password", **shared) as c:
        assert requests.get(f"{c}/api/status", cookies=replay, timeout=10).status_code == 401
        assert try_login(requests.Session(), c, "x", PASSWORD).status_code == 403
        logged_in(c, "a-new-password")
    assert not queue_status(engine, app.Task).paused


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("https", "behind_tls_proxy", "secure"),
    [(True, False, True), (False, True, True), (False, False, False)],
    ids=["https", "behind-tls-proxy", "plain-http"],
)
def test_the_cookie_is_secure_under_tls_or_behind_a_tls_proxy(
    engine: Engine, app: App, tmp_path: Path, https: bool, behind_tls_proxy: bool, secure: bool
) -> None:
    tls = self_signed(tmp_path) if https else None
    verify: Any = str(tls[0]) if tls else True
    with serving(engine, app, tls=tls, behind_tls_proxy=behind_tls_proxy) as base:
        assert base.startswith("https://" if https else "http://")
        # each connection closed by the server: uvicorn waits out (30 s) a TLS
        # connection the client closed first
        close = {"Connection": "close"}
        form = requests.get(f"{base}/login", timeout=10, verify=verify, headers=close)
        assert ("secure" in form.headers["set-cookie"].lower()) == secure
        csrf = CSRF.search(form.text)
        assert csrf
        # sent by hand: a client keeps a Secure cookie from plain HTTP to itself
        login = requests.post(
            f"{base}/login",
            data={"csrf": csrf.group(1), "username": "admin", "password": PASSWORD},
            headers={"Cookie": f"{COOKIE}={cookie_of(form)}", **close},
            timeout=10,
            verify=verify,
            allow_redirects=False,
        )
        assert login.status_code == 303
        cookie = login.headers["set-cookie"].lower()
        assert ("secure" in cookie) == secure
        assert "httponly" in cookie and "samesite=strict" in cookie


def test_task_ids_no_task_can_have_answer_404(engine: Engine, app: App) -> None:
    """On every database: beyond BIGINT, 0, and not a number."""
    with serving(engine, app) as base:
        web, token = logged_in(base)
        for text in (HUGE, "99999999999999999999999", "9" * 5000, "0", "00", "-1", "1e3"):
            page = web.get(f"{base}/tasks/{text}", timeout=10)
            assert page.status_code == 404, text
            api = web.get(f"{base}/api/tasks/{text}", timeout=10)
            assert api.status_code == 404, text
            action = web.post(
                f"{base}/api/tasks/{text}/cancel", headers={"X-CSRF-Token": token}, timeout=10
            )
            assert action.status_code == 404, text
        message = web.get(f"{base}/api/tasks/{HUGE}", timeout=10).json()["error"]
        assert message == f"no task {HUGE}: a task id is a whole number from 1 to {2**63 - 1}"
        # the largest id is a query like any other
        assert web.get(f"{base}/api/tasks/{2**63 - 1}", timeout=10).status_code == 404
        assert web.get(f"{base}/api/status", timeout=10).status_code == 200


def test_api_status_is_the_status_json_on_every_database(
    engine: Engine, app: App, installed: None
) -> None:
    dead_task(engine, app, {"n": 3})
    with Session(engine) as session:
        session.add_all([app.Task(process="relatorio", payload={"n": n}) for n in range(3)])
        session.commit()
    with serving(engine, app, read_only=True, password=None) as base:
        served = requests.get(f"{base}/api/status", timeout=10).json()
    expected = queue_status(engine, app.Task).as_json()
    for key in ("queue", "processes", "totals"):
        assert served[key] == expected[key]


def test_garbage_requests_leave_the_server_serving(engine: Engine, app: App) -> None:
    with serving(engine, app) as base:
        web, _ = logged_in(base)
        assert web.get(f"{base}/tasks/abc", timeout=10).status_code == 404
        assert web.get(f"{base}/tasks/987654321", timeout=10).status_code == 404
        assert web.post(f"{base}/api/tasks/1/explode", timeout=10).status_code == 403  # no token
        assert requests.post(f"{base}/api/tasks/1/explode", timeout=10).status_code == 401
        assert web.get(f"{base}/{'x' * 10000}", timeout=10).status_code in (404, 414, 431)
        host, port = base.removeprefix("http://").split(":")
        for garbage in (
            b"\x00\xff" * 500,
            b"GET / HTTP/9.9\r\n\r\n",
            b"POST /login HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nx",
            b"GET /api/status HTTP/1.1\r\n\r\n",  # no Host header at all
        ):
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(garbage)
                with contextlib.suppress(OSError):
                    raw.recv(1024)
        assert web.get(f"{base}/api/status", timeout=10).status_code == 200
