"""Screenshots of the dashboard for docs/img/ (docs/operations.md).

    .venv/bin/python scripts/dashboard-screenshots.py [OUTPUT_DIR]

Builds a small SQLite queue with a history (successes, retries, a dead task,
a hostile message, scheduled and ready tasks), serves the dashboard on a
free port and photographs its pages in Debian's headless chromium.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import socket
import sys
import tempfile
import threading
import time
from typing import Any

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Session

from sqla_queue import QueueMixin, WorkerBase, install
from sqla_queue.common.types import utcnow
from sqla_queue.ops.dashboard import DashboardConfig, create_app
from sqla_queue.testing import run_until_empty

PASSWORD = "screenshots"


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = "fila_faturamento"


class Billing(WorkerBase):
    model = Task
    max_retry = 2
    retry_interval_minutes = 0

    def execute(self, payload: Any, task: Any, session: Any) -> str | None:
        if payload.get("fail"):
            raise ValueError(
                f"invoice {payload['n']} rejected by the tax office: {payload['fail']}"
            )
        return f"invoice {payload['n']} issued"


def history(engine: Any) -> int:
    install(Session)
    with Session(engine) as session:
        session.add_all([Task(process="faturar", payload={"n": n}) for n in range(40)])
        session.add_all([Task(process="notificar", payload={"n": n}) for n in range(25)])
        bad = Task(process="faturar", payload={"n": 41, "fail": "CNPJ invalid"})
        session.add(bad)
        session.flush()
        run_until_empty(Billing, session)
        session.add_all([Task(process="faturar", payload={"n": 100 + n}) for n in range(7)])
        later = utcnow() + dt.timedelta(hours=2)
        session.add_all(
            [Task(process="relatorio", payload={"n": n}, run_at=later) for n in range(3)]
        )
        session.commit()
        return int(bad.id)


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/queue.db")
        Base.metadata.create_all(engine)
        dead = history(engine)
        web = create_app(engine, Task, config=DashboardConfig(password=PASSWORD))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning")
        )
        threading.Thread(target=server.run, daemon=True).start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline:
                raise SystemExit("the dashboard did not start")
            time.sleep(0.05)  # a script's start-up, not a test
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1280,900",
        ):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        base = f"http://127.0.0.1:{port}"
        try:
            driver.get(f"{base}/login")
            driver.find_element(By.ID, "username").send_keys("admin")
            driver.find_element(By.ID, "password").send_keys(PASSWORD)
            driver.find_element(By.ID, "submit").click()
            WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.ID, "logout"))
            for name, path in (
                ("dashboard-overview", "/"),
                ("dashboard-task", f"/tasks/{dead}"),
                ("dashboard-dead-letter", "/dead"),
            ):
                driver.get(base + path)
                if path == "/":
                    WebDriverWait(driver, 30).until(
                        lambda d: d.find_elements(By.CSS_SELECTOR, "#chart polyline")
                    )
                driver.save_screenshot(str(out / f"{name}.png"))
                print(out / f"{name}.png")
        finally:
            driver.quit()
            server.should_exit = True


if __name__ == "__main__":
    main()
