"""Network partitions: a worker cut off from the database stalls nobody.

Worker A runs in a cgroup of its own; an iptables rule drops every packet
its sockets send to the database's port (nothing is closed: the server
keeps A's sessions, and A's kernel still receives what the server sends).
A holds the routine locks (it ran alone first) and is in the middle of
tasks whose handlers wrote an idempotency key first. Worker B, started
after the cut, must finish every task while A is still cut off: A's
leases run out, A's routine locks and open transactions end within the
dead-peer bound (docs/lifecycle.md#network-partitions), the rescue and B
take over. After the heal: every chain ran once, one key each, and A works
again without a restart.

Needs root, iptables with its cgroup match, and a cgroup v2 hierarchy
(``.ci/run`` installs iptables; scripts/install-test-deps.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import BigInteger, Column, Engine, MetaData, Table, create_engine, func, select
from sqlalchemy.engine import make_url

from sqla_queue import QueueClient
from sqla_queue.adapters.liveness import Keepalive
from sqla_queue.config.settings import normalize_url
from tests.acceptance.test_concurrency import Spawned, statuses, stop_gracefully, worker_env
from tests.conftest import ROOT, WORKER_CLASSES, server_url, spawn_cli, wait_until
from tests.faults.test_fleet import OPEN, assert_each_chain_ran_once
from tests.support.app import App, build
from tests.support.queue_server import running_server
from tests.support.servers import PgBouncer

IPTABLES = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
#: the lease of both workers; their dead-peer bound is set to twice it, 4 s
#: (``auto`` would be 10 s, its floor)
LEASE = 2.0
#: every task done by B within this many seconds of the cut (two bounds,
#: a lease, the rescue's and the retry's rounds, and a loaded machine's slack)
DONE_WITHIN = 25.0


def _cgroup_root() -> Path | None:
    """The cgroup v2 hierarchy's mount point, if any."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "not root: iptables and cgroups need it"
    if IPTABLES is None:
        return "no iptables (scripts/install-test-deps.sh installs it)"
    if _cgroup_root() is None:
        return "no cgroup v2 hierarchy mounted"
    return None


class Cut:
    """A cgroup whose processes' packets to ``ports`` can be dropped."""

    def __init__(self, *ports: int) -> None:
        root = _cgroup_root()
        assert root is not None
        self.name = f"sqlaq-partition-{uuid.uuid4().hex[:8]}"
        self.path = root / self.name
        self.path.mkdir()
        self.ports = ports
        self.rule = [
            "OUTPUT", "-m", "cgroup", "--path", self.name, "-p", "tcp",
            "-m", "multiport", "--dports", ",".join(map(str, ports)), "-j", "DROP",
        ]  # fmt: skip
        self.rules: list[list[str]] = []
        self.active = False

    def spawn(self, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        """The CLI in this cgroup (it joins before it opens any socket)."""
        command = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
        cli = [sys.executable, "-m", "sqla_queue.cli", *args]
        return subprocess.Popen(
            ["sh", "-c", command, "sh", str(self.path), *cli],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def start(self) -> None:
        """Drop what the cgroup's processes send to the port, and what the
        port sends back on their connections open now: a partition drops
        both ways (else the server's retransmissions reach the cut-off
        kernel, whose resets for sockets it closed meanwhile would tell the
        server what a real partition never does)."""
        rules = [self.rule]
        for port, local in self._connections():
            back = ["--sport", str(port), "--dport", str(local)]
            rules.append(["OUTPUT", "-p", "tcp", *back, "-j", "DROP"])
        for rule in rules:
            subprocess.run([str(IPTABLES), "-A", *rule], check=True)
        self.rules = rules
        self.active = True

    def _connections(self) -> list[tuple[int, int]]:
        """(remote port, local port) of the cgroup's connections to the ports."""
        pids = set(self.path.joinpath("cgroup.procs").read_text().split())
        found = []
        for port in self.ports:
            listing = subprocess.run(
                ["ss", "-tnpH", "state", "established", "dport", f"= :{port}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for line in listing.splitlines():
                if any(f"pid={pid}," in line for pid in pids):
                    local = line.split()[2]  # Recv-Q Send-Q Local Peer Process
                    found.append((port, int(local.rsplit(":", 1)[1])))
        return found

    def heal(self) -> None:
        if self.active:
            for rule in self.rules:
                subprocess.run([str(IPTABLES), "-D", *rule], check=True)
            self.active = False

    def close(self) -> None:
        self.heal()
        for pid in self.path.joinpath("cgroup.procs").read_text().split():
            subprocess.run(["kill", "-9", pid], check=False)
        wait_until(lambda: not self.path.joinpath("cgroup.procs").read_text().strip(), 10)
        self.path.rmdir()


@pytest.fixture
def cuts() -> Iterator[Callable[..., Cut]]:
    """``cuts(*ports)``: a :class:`Cut` of packets to ``ports``, undone after."""
    why = _why_not()
    if why is not None:
        if os.environ.get("SQLA_QUEUE_REQUIRE_DATABASES"):
            pytest.fail(f"the partition tests cannot run: {why}")
        pytest.skip(why)
    made: list[Cut] = []

    def make(*ports: int) -> Cut:
        made.append(Cut(*ports))
        return made[-1]

    try:
        yield make
    finally:
        for cut in made:
            cut.close()


def _keyed_table(app: App) -> Table:
    return Table(
        f"{app.Task.__tablename__}_keyed",
        MetaData(),
        Column("chain_id", BigInteger, primary_key=True),
        Column("task_id", BigInteger, nullable=False),
    )


def _owners(engine: Engine, app: App, status: str) -> dict[int, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(app.Task.id, app.Task.worker_id).where(app.Task.status == status)
        ).all()
    return {task_id: owner for task_id, owner in rows}


@pytest.mark.parametrize("db_url", ["postgresql", "mysql"], indirect=True)
def test_a_worker_cut_off_from_the_database_stalls_nobody(
    db_url: str, table_name: str, cuts: Callable[..., Cut]
) -> None:
    url = make_url(db_url)
    port = url.port or (5432 if url.get_backend_name() == "postgresql" else 3306)
    _partition(db_url, db_url, table_name, cuts(port), {})


def test_a_worker_cut_off_from_pgbouncer_stalls_nobody(
    pgbouncer_factory: Callable[..., PgBouncer],
    table_name: str,
    cuts: Callable[..., Cut],
) -> None:
    """Behind a transaction-pooling PgBouncer whose keepalive settings fit the
    bound (docs/lifecycle.md#network-partitions): PgBouncer drops the silent
    client, and with it the server connection its transaction held."""
    keepalive = Keepalive.within(2 * LEASE)
    bouncer = pgbouncer_factory(
        "transaction",
        pool_size=24,
        tcp_keepalive=1,
        tcp_keepidle=keepalive.idle,
        tcp_keepintvl=keepalive.interval,
        tcp_keepcnt=keepalive.count,
        tcp_user_timeout=keepalive.user_timeout_ms,
    )
    url = f"{bouncer.url}?prepare_threshold=none"
    direct = str(normalize_url(server_url("postgresql")).render_as_string(hide_password=False))
    _partition(url, direct, table_name, cuts(bouncer.port), {"SQLA_QUEUE_TASK_LOCKS": "false"})


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_worker_cut_off_in_client_server_mode_stalls_nobody(
    db_url: str, table_name: str, cuts: Callable[..., Cut]
) -> None:
    """Client-server mode: the routine locks are the queue server's, which
    finds the silent client by TCP keepalive (LOCK_SERVICE_WAIT_CONN_INTERVAL,
    here 2 s) and frees them; A is cut from the database and the server."""
    url = make_url(db_url)
    app = build(table_name)
    engine = create_engine(db_url)
    app.Base.metadata.create_all(engine)  # the server checks the table at start
    engine.dispose()
    keepalive = {"LOCK_SERVICE_WAIT_CONN_INTERVAL": "2"}
    with running_server(
        WORKER_CLASSES["sync"]["recording"], db_url, table_name, **keepalive
    ) as server:
        cut = cuts(url.port or 5432, server.notify_port, server.lock_port)
        _partition(db_url, db_url, table_name, cut, server.env(**keepalive))


def _partition(
    worker_url: str,
    observer_url: str,
    table_name: str,
    cut: Cut,
    extra_env: dict[str, str],
    *,
    lease: float = LEASE,
    dead_peer: str = str(2 * LEASE),
    done_within: float = DONE_WITHIN,
    cut_seconds: float = 0.0,
) -> float:
    """The scenario of the module's docstring: workers on ``worker_url``, the
    test's own view on ``observer_url``; the cut lasts until every task is
    done, and at least ``cut_seconds``. How long after the cut every task
    was done."""
    app = build(table_name)
    engine = create_engine(observer_url, pool_pre_ping=True)
    app.Base.metadata.create_all(engine)
    keyed = _keyed_table(app)
    keyed.create(engine)
    env = worker_env(
        table_name,
        SQLA_QUEUE_TEST_LEASE=str(lease),
        SQLA_QUEUE_DEAD_PEER_SECONDS=str(dead_peer),
        **extra_env,
    )
    recording = WORKER_CLASSES["sync"]["recording"]
    args = ("worker", recording, "--url", worker_url, "--log-level", "INFO")
    # half write their key first, then work a while (the keyed effect);
    # the others only work
    payloads = [{"keyed": n % 2 == 0, "sleep": 0.4} for n in range(40)]
    with engine.begin() as conn:
        ids = QueueClient(conn, app.Task).insert_tasks(
            {"process": "bulk", "payload": payload} for payload in payloads
        )
    a = Spawned(cut.spawn(*args, "--concurrency", "2", env=env))
    workers = [a]
    later: list[int] = []
    try:
        # A alone long enough to hold the routine locks, and in the middle
        # of tasks when the cut comes
        wait_until(lambda: len(_owners(engine, app, "sucesso")) >= 4, 60, message="A's first tasks")
        owner_a = next(iter(_owners(engine, app, "sucesso").values()))
        wait_until(
            lambda: owner_a in _owners(engine, app, "processando").values(),
            30,
            message="A in the middle of a task",
        )
        cut.start()
        cut_at = time.monotonic()
        cut_off = set(_owners(engine, app, "processando"))
        b = Spawned(spawn_cli(*args, "--concurrency", "4", env=env))
        workers.append(b)
        wait_until(
            lambda: not OPEN & set(statuses(engine, app).values()),
            done_within,
            interval=0.1,
            message=f"every task done while A is cut off\n--- B:\n{b.output}",
        )
        took = time.monotonic() - cut_at
        assert cut.active
        print(f"every task done {took:.1f} s after the cut; A was running {sorted(cut_off)}")
        # a longer cut, as the by-hand run asks (partition_run.py): a
        # scenario's length, not a wait for a condition
        threading.Event().wait(max(0.0, cut_at + cut_seconds - time.monotonic()))
        cut.heal()
        # A works again, without a restart: B stops, new tasks are A's
        stop_gracefully([b])
        workers.remove(b)
        with engine.begin() as conn:
            later = QueueClient(conn, app.Task).insert_tasks(
                {"process": "bulk", "payload": {"n": n}} for n in range(4)
            )
        wait_until(
            lambda: all(statuses(engine, app).get(i) == "sucesso" for i in later),
            60,
            interval=0.1,
            message=f"A running tasks after the heal\n--- A:\n{a.output}",
        )
        assert {_owners(engine, app, "sucesso")[i] for i in later} == {owner_a}
        stop_gracefully([a])
        workers.remove(a)
    finally:
        for worker in workers:
            worker.kill()
    assert_each_chain_ran_once(engine, app, ids + later)
    with engine.connect() as conn:
        keys = conn.execute(select(func.count()).select_from(keyed)).scalar()
    assert keys == len([p for p in payloads if p["keyed"]])
    keyed.drop(engine)
    app.Base.metadata.drop_all(engine)
    engine.dispose()
    return took
