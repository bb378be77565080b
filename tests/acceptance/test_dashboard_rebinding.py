"""DNS rebinding against the dashboard, in a real browser (issue 48, item 1).

A page of evil.example whose name the attacker then points at 127.0.0.1
runs in the operator's browser with evil.example as its origin: its
requests reach the dashboard with ``Host: evil.example``, and the browser
lets the page read the answers (same origin). Debian's Chromium is told
that evil.example is 127.0.0.1 (``--host-resolver-rules``), as it would
be after the rebinding. The dashboard is read-only, the case where no
login stands in the way: only the ``Host`` allow-list does. Over HTTP the
same check is tests/acceptance/test_dashboard.py's
test_a_foreign_host_header_is_refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.acceptance.test_dashboard import CHROMEDRIVER, CHROMIUM, serving

REBOUND = "evil.example"
SECRET_URL = "https://user:pw@hooks.example.com/services/T0/B0/SECRETPATH?token=SECRETQ"
#: a script of the page's origin reads an answer of the dashboard (same origin)
FETCH = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(
    (answer) => answer.text().then((text) => done([answer.status, text])),
    (error) => done([0, String(error)]),
);
"""


@pytest.fixture(scope="module")
def rebound_browser() -> Iterator[Any]:
    """Chromium resolving evil.example to 127.0.0.1, as after a rebinding."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
        # plain http://evil.example:PORT as typed, not tried as https first
        "--disable-features=HttpsUpgrades",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_page_of_a_rebound_name_reads_nothing_of_the_dashboard(
    pengine: Engine, papp: Any, rebound_browser: Any
) -> None:
    browser = rebound_browser
    with Session(pengine) as session:
        session.add(papp.Subscriber(id="s1", process="faturar", url=SECRET_URL))
        session.commit()
    with serving(
        pengine, papp, subscriber_model=papp.Subscriber, read_only=True, password=None
    ) as base:
        port = base.rsplit(":", 1)[1]
        # the browser reaches the dashboard at its own address: the page is there
        browser.get(f"{base}/subscriptions")
        assert "https://hooks.example.com/***" in browser.find_element(By.TAG_NAME, "main").text
        # the rebound name reaches the same socket and gets nothing
        evil = f"http://{REBOUND}:{port}"
        for path in ("/subscriptions", "/api/status", "/"):
            browser.get(f"{evil}{path}")
            assert browser.current_url == f"{evil}{path}"  # no redirect, no error page
            assert browser.find_element(By.TAG_NAME, "body").text == "Invalid host header"
            assert "hooks.example.com" not in browser.page_source
        # nor does a script of that origin, whose requests the browser would let it read
        for path in ("/api/status", "/subscriptions", "/api/tasks"):
            status, text = browser.execute_async_script(FETCH, path)
            assert (status, text) == (400, "Invalid host header"), path
