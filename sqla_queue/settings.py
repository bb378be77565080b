"""Configuration from the environment: the seed's variables, read once.

``SQLA_QUEUE_URL`` names the database as a SQLAlchemy URL; without it the
seed's ``DB_*`` / ``DATABASE_*`` variables build one. Every other variable
keeps the seed's name and default (see ``docs/configuration.md``), with one
fix: ``QUEUE_WAIT_NOTIFY_INTERVAL`` is read from its own name (the reference
read it from ``QUEUE_PURGE_LIMIT``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, make_url

from .exceptions import ConfigurationError

__all__ = ["Settings", "database_url", "engine_options", "normalize_url"]

_DRIVERS = {
    "POSTGRES": "postgresql+psycopg",
    "POSTGRESQL": "postgresql+psycopg",
    "MYSQL": "mysql+pymysql",
    "MARIADB": "mysql+pymysql",
    "SINGLE_STORE": "singlestoredb",
    "SINGLESTORE": "singlestoredb",
    "SQLITE": "sqlite",
}
_DEFAULT_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}


def normalize_url(url: str | URL) -> URL:
    """A URL with the driver sqla-queue uses when none is named
    (psycopg 3 for PostgreSQL, PyMySQL for MySQL and MariaDB)."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigurationError(f"invalid database URL: {exc}") from None
    if parsed.drivername in _DEFAULT_DRIVERS:
        parsed = parsed.set(drivername=_DEFAULT_DRIVERS[parsed.drivername])
    return parsed


def engine_options(url: URL) -> tuple[URL, dict[str, Any]]:
    """The URL without the options sqla-queue reads itself, and the DBAPI
    connect arguments they stand for.

    ``prepare_threshold`` (psycopg 3): ``none`` turns off the server-side
    prepared statements psycopg makes after five runs of a statement, which
    a transaction-pooling PgBouncer before 1.21 hands to other clients
    (docs/pgbouncer.md). psycopg would take the URL's text as is, and fail."""
    connect_args: dict[str, Any] = {}
    raw = url.query.get("prepare_threshold")
    if raw is None:
        return url, connect_args
    value = raw if isinstance(raw, str) else raw[-1]
    if value.strip().lower() in ("none", "null", ""):
        connect_args["prepare_threshold"] = None
    else:
        try:
            connect_args["prepare_threshold"] = int(value)
        except ValueError:
            raise ConfigurationError(
                f"prepare_threshold in the database URL must be a number or none, not {value!r}"
            ) from None
    return url.difference_update_query(["prepare_threshold"]), connect_args


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return _first_named(env, *names)[1]


def _first_named(env: Mapping[str, str], *names: str) -> tuple[str, str | None]:
    """The first of ``names`` set to a non-empty value, and that value (so an
    error can name the variable the user actually set)."""
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return name, value
    return names[0], None


def database_url(env: Mapping[str, str] | None = None) -> URL | None:
    """``SQLA_QUEUE_URL``, else a URL from the seed's ``DB_*`` variables,
    else None."""
    env = os.environ if env is None else env
    if env.get("SQLA_QUEUE_URL"):
        return normalize_url(env["SQLA_QUEUE_URL"])
    host = _first(env, "DB_HOST", "DATABASE_HOST")
    name = _first(env, "DB_BASE", "DATABASE_NAME")
    driver_variable, driver_value = _first_named(env, "DB_DRIVER", "DATABASE_DRIVER")
    driver_name = (driver_value or "POSTGRES").upper()
    if driver_name not in _DRIVERS:
        raise ConfigurationError(
            f"{driver_variable}={driver_value!r} is not one of {', '.join(sorted(_DRIVERS))}"
        )
    driver = _DRIVERS[driver_name]
    if driver == "sqlite":
        return URL.create("sqlite", database=name) if name else None
    if host is None or name is None:
        return None
    port_variable, port = _first_named(env, "DB_PORT", "DATABASE_PORT")
    try:
        port_number = int(port) if port is not None else None
    except ValueError:
        raise ConfigurationError(f"{port_variable} must be a number, not {port!r}") from None
    return URL.create(
        driver,
        username=_first(env, "DB_USER", "DATABASE_USER"),
        password=_first(env, "DB_PASS", "DATABASE_PASS"),
        host=host,
        port=port_number,
        database=name,
    )


def _number(env: Mapping[str, str], name: str, default: float, *, integer: bool = False) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ConfigurationError(f"{name} must be {kind}, not {raw!r}") from None
    if value < 0:
        raise ConfigurationError(f"{name} cannot be negative ({raw!r})")
    return value


def _flag(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, not {env[name]!r}")


@dataclass(frozen=True)
class Settings:
    """What a worker reads from the environment."""

    url: URL | None = None
    queue_name: str | None = None
    queue_table: str | None = None
    max_retry: int = 100
    base_interval_retry_minutes: float = 5.0
    poll_interval_seconds: float = 1.0
    listen_fallback_seconds: float = 5.0
    log_debug: bool = False
    task_locks: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            url=database_url(env),
            queue_name=env.get("QUEUE_NAME") or None,
            queue_table=env.get("QUEUE_TABLE") or None,
            max_retry=int(_number(env, "QUEUE_MAX_RETRY", 100, integer=True)),
            base_interval_retry_minutes=_number(env, "QUEUE_BASE_INTERVAL_RETRY", 5.0),
            poll_interval_seconds=_number(env, "SQLA_QUEUE_POLL_INTERVAL", 1.0),
            listen_fallback_seconds=_number(env, "QUEUE_WAIT_NOTIFY_INTERVAL", 5.0),
            log_debug=env.get("LOG_DEBUG", "").strip().upper() in ("TRUE", "1", "YES"),
            task_locks=_flag(env, "SQLA_QUEUE_TASK_LOCKS", default=True),
        )
