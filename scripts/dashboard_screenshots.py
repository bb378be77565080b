"""Screenshots of the dashboard for docs/operations.md, from a run with real data.

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/images]

On a SQLite file in a temporary folder: 240 tasks of three processes are
enqueued, a real ``sqla-queue worker --burst`` runs them (one in eight
fails until its retries are spent, some are cancelled, a few are left
ready), their finish times are spread over the last hour (so that the
history chart has an hour to show), then a second worker runs two slow
tasks while the real ``sqla-queue dashboard --read-only`` is photographed
by Debian's Chromium (the overview, the task browser, a task with its
payload, the workers and the processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import DeclarativeBase, Session

from sqla_queue import QueueMixin, WorkerBase, install
from sqla_queue.adapters import adapter_for
from sqla_queue.client.control import cancel_task
from sqla_queue.schema.mixins import channel_of

HERE = Path(__file__).resolve().parent
PORT = 8793
TABLE = "fila_pedidos"


class Base(DeclarativeBase):
    pass


class Task(QueueMixin, Base):
    __tablename__ = TABLE


class Orders(WorkerBase):
    """Bills, mails and syncs orders; a payload with "fail" fails."""

    model = Task
    max_retry = 2
    retry_interval_minutes = 0

    def execute(self, payload: Any, task: Any, session: Any) -> str:
        if payload.get("fail"):
            raise ValueError(f"order {payload['order']} has no customer")
        time.sleep(payload.get("seconds", 0))  # the handler's own work
        return f"{task.process} done for order {payload['order']}"


def _cli(url: str, *args: str, wait: bool = True) -> Any:
    command = [sys.executable, "-m", "sqla_queue.cli", *args, "--url", url]
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}"}
    if wait:
        return subprocess.run(command, cwd=HERE, env=env, check=True, capture_output=True)
    return subprocess.Popen(command, cwd=HERE, env=env)


def fill(url: str) -> None:
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    install(Session)
    with Session(engine) as session:
        for n in range(240):
            process = ("faturar", "enviar_email", "sincronizar")[n % 3]
            payload = {"order": 1000 + n, "customer": f"c{n % 17}", "api_token": "s3cr3t"}
            if n % 8 == 5:
                payload["fail"] = True
            session.add(Task(process=process, payload=payload, external_key=f"order-{1000 + n}"))
        session.commit()
    _cli(url, "worker", "dashboard_screenshots:Orders", "--burst")
    with engine.begin() as conn:  # finished over the last hour, as a day's traffic would have
        if engine.dialect.name == "sqlite":
            conn.execute(
                text(
                    f"UPDATE {TABLE} SET finished_at = datetime(finished_at, "
                    "'-' || ((id * 7) % 60) || ' minutes') WHERE finished_at IS NOT NULL"
                )
            )
    with Session(engine) as session:
        for n in range(6):
            session.add(Task(process="faturar", payload={"order": 2000 + n}))
        session.add(Task(process="relatorio", payload={"order": 3000, "seconds": 60}))
        session.add(Task(process="relatorio", payload={"order": 3001, "seconds": 60}))
        session.commit()
        ready = session.scalars(
            select(Task.id).where(Task.process == "faturar", Task.status == "pendente")
        ).all()
    adapter = adapter_for(engine.dialect, Task.__table__, channel_of(Task, Task.__table__))
    with engine.begin() as conn:
        for task_id in ready[:2]:
            cancel_task(conn, adapter, task_id)
    engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(HERE.parent / "docs" / "img"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder / 'shop.db'}"
    fill(url)
    slow = _cli(url, "worker", "dashboard_screenshots:Orders", "--concurrency", "2", wait=False)
    board = _cli(
        url, "dashboard", "dashboard_screenshots:Orders", "--read-only", "--port", str(PORT),
        wait=False,
    )  # fmt: skip
    base = f"http://127.0.0.1:{PORT}"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(
        service=Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver"),
        options=options,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the dashboard's start and the slow tasks' claim
            try:
                workers = requests.get(f"{base}/api/workers", timeout=2).json()["workers"]
                if workers:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        with_payload = requests.get(f"{base}/api/tasks", params={"state": "failed"}, timeout=10)
        failed_id = with_payload.json()["tasks"][0]["id"]
        for name, path in (
            ("overview", "/"),
            ("tasks", "/tasks"),
            ("task", f"/tasks/{failed_id}"),
            ("workers", "/workers"),
            ("processes", "/processes"),
            ("dead-letter", "/dead"),
        ):
            driver.get(base + path)
            driver.save_screenshot(str(out / f"dashboard-{name}.png"))
            print(out / f"dashboard-{name}.png")
    finally:
        driver.quit()
        board.terminate()
        board.wait(30)
        slow.kill()  # its 60 s tasks: a throwaway database, nothing to keep
        slow.wait(30)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
