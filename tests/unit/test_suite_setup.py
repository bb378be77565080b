"""The test suite itself: it runs against whatever servers it is given.

tests/conftest.py resolves the PostgreSQL and MariaDB servers from
SQLA_QUEUE_TEST_POSTGRES_URL / SQLA_QUEUE_TEST_MYSQL_URL (else the local
ones on their default ports); a test that writes a server's address itself
reaches the local default servers whatever the variables say.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# an address of the local default servers, or their port as a string
_SHARED_SERVER = re.compile(
    r"(?:127\.0\.0\.1|localhost|\[::1\]):(?:5432|3306)\b|[\"'](?:5432|3306)[\"']"
)
# where the default is defined, and examples that are never connected to
_ALLOWED = {"conftest.py", "test_units.py"}


def test_every_test_reaches_the_database_servers_through_the_configured_urls() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name not in _ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _SHARED_SERVER.search(line)
    ]
    assert found == [], "use tests.conftest.server_url(kind) instead:\n" + "\n".join(found)
