"""scripts/install-test-deps.sh, run for real with a recording ``apt-get``
in front of PATH: what it asks apt for, and when."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

TOOLS = ("pgbouncer", "psql", "mysql", "sqlite3", "java", "chromium", "chromedriver")
JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/mariadb-java-client.jar")
# what the script itself runs, from this machine
COMMANDS = ("bash", "dirname", "id", "mktemp", "rm", "cat", "env")


def _run(tmp_path: Path, tools: tuple[str, ...]) -> list[str]:
    """Run the script with only ``tools`` on PATH (stubs) and a recording
    apt-get; the apt-get command lines it ran."""
    scripts, bin_ = tmp_path / "scripts", tmp_path / "bin"
    scripts.mkdir()
    bin_.mkdir()
    shutil.copy(ROOT / "scripts" / "install-test-deps.sh", scripts)
    # the reference's venv is another script's business
    (scripts / "install-nsj-reference.sh").write_text("#!/bin/sh\nexit 0\n")
    calls = tmp_path / "apt-calls"
    (bin_ / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    for tool in tools:
        (bin_ / tool).write_text("#!/bin/sh\nexit 0\n")
    for stub in [*bin_.iterdir(), scripts / "install-nsj-reference.sh"]:
        stub.chmod(0o755)
    for command in COMMANDS:
        found = shutil.which(command)
        assert found is not None, command
        (bin_ / command).symlink_to(found)
    done = subprocess.run(
        [str(bin_ / "bash"), str(scripts / "install-test-deps.sh")],
        env={"PATH": str(bin_), "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.skipif(os.geteuid() != 0, reason="the script installs only as root (or sudo -n)")
def test_a_missing_package_is_installed_after_apt_get_update(tmp_path: Path) -> None:
    """A fresh machine's package lists are stale or empty: update first."""
    calls = _run(tmp_path, tuple(tool for tool in TOOLS if tool != "psql"))
    assert [call.split()[0] for call in calls] == ["update", "install"], calls
    assert "postgresql-client" in calls[1].split()


@pytest.mark.skipif(
    not all(Path(jar).is_file() for jar in JARS),
    reason="needs Debian's JDBC jars installed (the script looks at their paths)",
)
def test_with_everything_installed_apt_is_not_called(tmp_path: Path) -> None:
    assert _run(tmp_path, TOOLS) == []
