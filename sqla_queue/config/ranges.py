"""The ranges numeric settings are checked against: a leaf module.

Every setting that takes a number (an environment variable, a worker class
attribute, a ``queue_configuration`` row) is checked against one of these
when it is read, so NaN, the infinities and absurd values stop a worker at
start with one line naming the setting. The command line's numbers are
checked against them too (``sqla_queue/cli/checks.py``). The settings, the catalogue, the
leases and the routines all import from here; this module imports nothing
of sqla-queue's but its exceptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..common.exceptions import ConfigurationError

__all__ = [
    "BASE_INTERVAL_MINUTES",
    "CHECK_SECONDS",
    "CONCURRENCY",
    "CREDENTIALS_TTL",
    "DEFAULT_LEASE_SECONDS",
    "HTTP_TIMEOUT",
    "KEEPALIVE_SECONDS",
    "LEASE_SECONDS",
    "LISTEN_PORT",
    "MAX_CLIENTS",
    "MAX_RETRY",
    "MAX_UNAUTHENTICATED",
    "OLDER_THAN_SECONDS",
    "PORT",
    "REQUEUE_LIMIT",
    "SOCKET_SECONDS",
    "TASK_ID",
    "TENANT_ENGINES",
    "WAIT_SECONDS",
    "WATCH_SECONDS",
    "WINDOW_SECONDS",
    "Range",
]


@dataclass(frozen=True)
class Range:
    """The values a numeric setting accepts, and how to say so in an error.

    Every bound is finite, so NaN and the infinities are always refused
    (``float("nan")`` parses, and would compare false with every bound)."""

    #: give an int bound where a float would round it (2**63 - 1 as a float
    #: is 2**63): the comparisons of int values with int bounds are exact
    low: float
    high: float
    integer: bool = False
    #: ``low`` itself is refused (an interval that must be more than 0)
    low_open: bool = False
    unit: str = ""

    def describe(self) -> str:
        kind = "a whole number" if self.integer else "a number"
        if self.unit:
            kind += f" of {self.unit}"
        low, high = _show(self.low), _show(self.high)
        if self.low_open:
            return f"{kind} greater than {low} and at most {high}"
        return f"{kind} from {low} to {high}"

    def contains(self, value: object) -> bool:
        # bool is an int to Python, never to a setting: max_retry = True is a mistake
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def check(self, name: str, value: object) -> float:
        """``value`` if it is in range, else a ConfigurationError naming ``name``."""
        if not self.contains(value):
            raise ConfigurationError(f"{name} must be {self.describe()}, not {value!r}")
        return value  # type: ignore[return-value]  # contains() checked it is a number


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


# Ranges shared by the environment variables and the worker's class attributes.
#: attempts in all; a million is far past any real retry policy
MAX_RETRY = Range(1, 1_000_000, integer=True)
#: minutes; at most a day, so that attempt n's wait (n times this) stays within
#: datetime's range even after a million attempts
BASE_INTERVAL_MINUTES = Range(0, 24 * 60, unit="minutes")
#: seconds an idle lane waits (poll, NOTIFY fallback); 0 would spin on the database
WAIT_SECONDS = Range(0, 24 * 60 * 60, low_open=True, unit="seconds")
PORT = Range(1, 65535, integer=True)

#: seconds a lease lasts unless renewed
DEFAULT_LEASE_SECONDS = 30.0
#: shorter than half a second, heartbeats would be most of a worker's work
LEASE_SECONDS = Range(0.5, 7 * 24 * 3600, unit="seconds")

# ------------------------------------------------------ multi-database tenants
#: seconds a tenant's credentials are reused before the API is asked again
CREDENTIALS_TTL = Range(0, 24 * 60 * 60, unit="seconds")
#: engines kept open, one per tenant, least recently used evicted
TENANT_ENGINES = Range(1, 10_000, integer=True)
#: seconds an HTTP call to the token endpoint or the credentials API may take
HTTP_TIMEOUT = Range(0, 300, low_open=True, unit="seconds")

# ------------------------------------------------------ client-server mode
#: seconds one protocol message may take to arrive whole, and a server to answer
SOCKET_SECONDS = Range(0, 3600, low_open=True, unit="seconds")
#: clients the server serves at once (the seed's MAX_CLIENT_THREADS)
MAX_CLIENTS = Range(1, 100_000, integer=True)
#: connections that have not authenticated yet, in all and from one address
MAX_UNAUTHENTICATED = Range(1, 100_000, integer=True)
#: seconds between the server's looks at the queue (the seed's CHECK_TASKS_INTERVAL)
CHECK_SECONDS = Range(0, 24 * 60 * 60, low_open=True, unit="seconds")
#: seconds a connection may stay silent before its peer is probed
KEEPALIVE_SECONDS = Range(1, 24 * 60 * 60, unit="seconds")

# ------------------------------------------------------ the command line
#: a task's (an attempt's) id: a BIGINT's positive values, on every database
TASK_ID = Range(1, 2**63 - 1, integer=True)
#: lanes of one worker process (each holds two connections)
CONCURRENCY = Range(1, 10_000, integer=True)
#: a port a server listens on (0: one the system picks)
LISTEN_PORT = Range(0, 65535, integer=True)
#: dead tasks one ``requeue`` takes
REQUEUE_LIMIT = Range(1, 10_000, integer=True)
#: seconds between ``status --watch``'s refreshes
WATCH_SECONDS = Range(0.5, 3600, unit="seconds")
#: ``status --window``: below a second a rate means nothing; at most a
#: hundred years back, within every database's dates
WINDOW_SECONDS = Range(1, 100 * 365 * 86400, unit="seconds")
#: ``cancel --older-than``: 0 (every waiting task) to a hundred years
OLDER_THAN_SECONDS = Range(0, 100 * 365 * 86400, unit="seconds")
#: ``sqla-queue spark``: a task's prioridade (an int column), JDBC read
#: partitions, rows listed, families per archive chunk, retention days
PRIORITY = Range(-(2**31) + 1, 2**31 - 1, integer=True)
SPARK_PARTITIONS = Range(1, 100_000, integer=True)
SPARK_LISTED = Range(1, 100_000, integer=True)
CHUNK_FAMILIES = Range(1, 10_000_000, integer=True)
RETENTION_DAYS = Range(0, 36600, unit="days")


# ---------------------------------------------------------------- the settings'
#: seconds a handler may run; at most a week
TIME_LIMIT_SECONDS = Range(0, 7 * 24 * 3600, low_open=True, unit="seconds")
ITEM_DELAY_SECONDS = Range(0, 24 * 3600, unit="seconds")
#: a minute: an outcome that may wait longer than that is a transaction held open too long
COMMIT_BUDGET_MS = Range(0, 60_000, unit="milliseconds")
#: seconds: below two, keepalive probes a second apart could not fit in it
DEAD_PEER_SECONDS = Range(2, 7 * 24 * 3600, unit="seconds")
#: minutes; 0 turns the TTL off; at most ten years
ITEM_TTL_MINUTES = Range(0, 10 * 365 * 24 * 60, unit="minutes")
BACKOFF_BASE_SECONDS = Range(0, 86_400, unit="seconds")
BACKOFF_FACTOR = Range(1, 10)
BACKOFF_JITTER_SECONDS = Range(0, 86_400, unit="seconds")
PURGE_MAX_AGE_DAYS = Range(0, 36500, unit="days")
PURGE_LIMIT = Range(1, 100_000, integer=True)
PURGE_ROUNDS = Range(1, 1_000_000, integer=True)
VACUUM_DEAD_TUPLES = Range(0, 1_000_000_000, integer=True)
