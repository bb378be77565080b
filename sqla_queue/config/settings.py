"""Configuration from the environment: the seed's variables, read once.

``SQLA_QUEUE_URL`` names the database as a SQLAlchemy URL; without it the
seed's ``DB_*`` / ``DATABASE_*`` variables build one. Every other variable
keeps the seed's name and default (see ``docs/configuration.md``), with one
fix: ``QUEUE_WAIT_NOTIFY_INTERVAL`` is read from its own name (the reference
read it from ``QUEUE_PURGE_LIMIT``). Every number is checked against a range
when it is read (NaN, infinities and absurd values stop the worker at start
with one line naming the variable), and a URL whose driver is not installed
is reported with the extra that installs it (:func:`driver_error`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from ..common.exceptions import ConfigurationError
from ..common.redaction import redact
from .ranges import (
    BASE_INTERVAL_MINUTES,
    CHECK_SECONDS,
    CREDENTIALS_TTL,
    HTTP_TIMEOUT,
    KEEPALIVE_SECONDS,
    MAX_CLIENTS,
    MAX_RETRY,
    MAX_UNAUTHENTICATED,
    PORT,
    SOCKET_SECONDS,
    TENANT_ENGINES,
    WAIT_SECONDS,
    Range,
)

if TYPE_CHECKING:
    from .sources import QueueEnvironment

__all__ = [
    "BASE_INTERVAL_MINUTES",
    "MAX_RETRY",
    "PORT",
    "WAIT_SECONDS",
    "Range",
    "ServerSettings",
    "Settings",
    "TenantSettings",
    "database_url",
    "driver_error",
    "engine_options",
    "make_async_engine",
    "make_engine",
    "normalize_url",
]

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


# The drivers that sqla-queue's extras install, by backend name: (database,
# the top-level modules the extra provides, the driver as users know it, extra).
_EXTRAS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "postgresql": ("PostgreSQL", ("psycopg",), "psycopg", "postgresql"),
    "mysql": ("MySQL", ("pymysql",), "PyMySQL", "mysql"),
    "mariadb": ("MariaDB", ("pymysql",), "PyMySQL", "mysql"),
    "singlestoredb": (
        "SingleStore",
        ("singlestoredb", "sqlalchemy_singlestoredb"),
        "singlestoredb",
        "singlestore",
    ),
}


def driver_error(url: URL, exc: BaseException) -> ConfigurationError | None:
    """The one-line error for ``create_engine(url)`` failing with ``exc``
    because a driver is missing, naming the extra that installs it; None
    when ``exc`` is some other error.

    ``exc`` is the ImportError of the DBAPI module (``postgresql+psycopg://``
    without psycopg) or the NoSuchModuleError of a dialect that is not
    installed (``singlestoredb://`` without sqlalchemy-singlestoredb)."""
    backend = url.get_backend_name()
    known = _EXTRAS.get(backend)
    if isinstance(exc, NoSuchModuleError):
        # Only SingleStore's dialect is a package of its own (the extra installs
        # it); "postgresql+nosuch://" is a typo, reported as it is.
        if backend != "singlestoredb" or known is None:
            return None
        database, _, driver, extra = known
        return ConfigurationError(
            f"the {database} driver {driver} is not installed: pip install 'sqla-queue[{extra}]'"
        )
    if not isinstance(exc, ImportError):
        return None
    module = (exc.name or "").partition(".")[0]
    if known is not None and (module in known[1] or not module):
        database, _, driver, extra = known
        # no module name: the driver is there but cannot load (psycopg without libpq)
        problem = "is not installed" if module else f"cannot be imported ({_first_line(exc)})"
        return ConfigurationError(
            f"the {database} driver {driver} {problem}: pip install 'sqla-queue[{extra}]'"
        )
    # A driver that no extra installs (postgresql+pg8000://, mysql+mysqldb://):
    # name its module, and the URL that uses the extra's driver instead.
    database = known[0] if known is not None else backend
    message = (
        f"the {database} driver module {module or '?'} (for {url.drivername}://) "
        "is not installed: install it"
    )
    if known is not None:
        message += f", or use {backend}:// with pip install 'sqla-queue[{known[3]}]'"
    return ConfigurationError(message)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_engine(
    url: str | URL,
    *,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    error: type[Exception] = ConfigurationError,
    label: str = "the database URL",
) -> Engine:
    """Every engine sqla-queue makes (workers, the queue server, tenant
    databases): the driver sqla-queue uses when the URL names none, its URL
    options as connect arguments (:func:`engine_options`), connections
    checked before use, the pool sized for its users (``pool_size``,
    ``max_overflow``; an in-memory SQLite database keeps SQLAlchemy's own
    single-connection pool), and a driver that is not installed named with
    the extra that installs it. Any other bad URL is one ``error`` naming
    ``label`` (without the password)."""
    parsed, connect_args = engine_options(normalize_url(url))
    options: dict[str, Any] = {"pool_pre_ping": True, "connect_args": connect_args}
    in_memory = parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")
    if not in_memory:
        if pool_size is not None:
            options["pool_size"] = pool_size
        if max_overflow is not None:
            options["max_overflow"] = max_overflow
    try:
        return create_engine(parsed, **options)
    except (ArgumentError, ImportError) as exc:  # NoSuchModuleError: an unknown dialect
        missing = driver_error(parsed, exc)  # a driver not installed: name its extra
        if missing is not None:
            raise missing from None
        raise error(
            f"cannot use {label} {parsed.render_as_string(hide_password=True)}: {redact(str(exc))}"
        ) from None


# The async driver of each backend an async worker's lanes use (docs/async.md),
# with the extra that installs it: psycopg 3's own async mode, asyncmy (not
# aiomysql, which fails every bytes parameter with PyMySQL 1.2.3+), aiosqlite
_ASYNC_DRIVERS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "postgresql": ("psycopg_async", ("psycopg", "greenlet"), "postgresql"),
    "mysql": ("asyncmy", ("asyncmy", "greenlet"), "mysql"),
    "mariadb": ("asyncmy", ("asyncmy", "greenlet"), "mysql"),
    "sqlite": ("aiosqlite", ("aiosqlite", "greenlet"), "sqlite"),
}


def async_url(url: str | URL) -> URL:
    """The URL of ``url``'s database through its backend's async driver (the
    same host, credentials, database and options)."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    known = _ASYNC_DRIVERS.get(backend)
    if known is None:
        raise ConfigurationError(
            f"async workers need an async driver, and {backend} has none "
            "(docs/async.md): define the handlers with def"
        )
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigurationError(
            "async workers cannot share an in-memory SQLite database (each async "
            "connection would open its own): use a file"
        )
    return parsed.set(drivername=f"{backend}+{known[0]}")


def make_async_engine(url: str | URL, *, pool_size: int, max_overflow: int = 0) -> Any:
    """The ``AsyncEngine`` of an async worker's lanes: ``url``'s database
    through its async driver, with the options :func:`make_engine` gives
    (connections checked before use, the pool sized for the lanes); a
    missing driver or greenlet named with the extra that installs them."""
    parsed, connect_args = engine_options(async_url(url))
    backend = parsed.get_backend_name()
    _, modules, extra = _ASYNC_DRIVERS[backend]
    try:
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(
            parsed,
            pool_pre_ping=True,
            connect_args=connect_args,
            pool_size=pool_size,
            max_overflow=max_overflow,
        )
    except ImportError as exc:
        module = (exc.name or "").partition(".")[0]
        missing = module if module in modules else "greenlet"
        raise ConfigurationError(
            f"async workers on {backend} need {missing}, which is not installed: "
            f"pip install 'sqla-queue[{extra}]'"
        ) from None


def engine_options(url: URL) -> tuple[URL, dict[str, Any]]:
    """The URL without the options sqla-queue reads itself, and the DBAPI
    connect arguments they stand for.

    ``prepare_threshold`` (psycopg 3): ``none`` turns off the server-side
    prepared statements psycopg makes after five runs of a statement, which
    a transaction-pooling PgBouncer before 1.21 hands to other clients
    (docs/pgbouncer.md). psycopg would take the URL's text as is, and fail.
    A ``singlestoredb://`` URL's password goes to the connect arguments
    (docs/singlestore.md)."""
    connect_args: dict[str, Any] = {}
    if url.get_backend_name() == "singlestoredb" and url.password is not None:
        # sqlalchemy-singlestoredb writes the URL back as text for its driver
        # without quoting "/", so a password holding one fails to parse:
        # hand the password over as a connect argument instead
        connect_args["password"] = url.password
        url = URL.create(
            url.drivername, url.username, None, url.host, url.port, url.database, url.query
        )
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
    port_number = int(_number({port_variable: port}, port_variable, 0, PORT)) if port else None
    return URL.create(
        driver,
        username=_first(env, "DB_USER", "DATABASE_USER"),
        password=_first(env, "DB_PASS", "DATABASE_PASS"),
        host=host,
        port=port_number,
        database=name,
    )


def _number(env: Mapping[str, str], name: str, default: float, allowed: Range) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value: float = int(raw) if allowed.integer else float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be {allowed.describe()}, not {raw!r}") from None
    if not allowed.contains(value):
        raise ConfigurationError(f"{name} must be {allowed.describe()}, not {raw!r}")
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
    #: the seed's Grafana Loki push endpoint (logs.py); may hold credentials
    grafana_url: str | None = field(default=None, repr=False)
    #: the seed's ENV: the environment name in the Loki label
    env: str = "DEV"
    task_locks: bool = True
    #: take nsj-queue-lib's task lock too: a mixed fleet (adapters/nsj.py)
    nsj_locks: bool = False
    #: multi-database tenants (MULTI_DATABASE and its companions); docs/tenants.md
    tenants: TenantSettings = field(default_factory=lambda: TenantSettings())
    #: client-server mode and the socket server (CLIENT_SERVER_MODE and
    #: companions); docs/client-server.md
    server: ServerSettings = field(default_factory=lambda: ServerSettings())
    #: the settings catalogue's variables as set (leases, backoff, maintenance...),
    #: checked when read; resolved with the queue_configuration table (catalog.py)
    environment: QueueEnvironment = field(default_factory=lambda: _queue_environment({}))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            url=database_url(env),
            queue_name=env.get("QUEUE_NAME") or None,
            queue_table=env.get("QUEUE_TABLE") or None,
            max_retry=int(_number(env, "QUEUE_MAX_RETRY", 100, MAX_RETRY)),
            base_interval_retry_minutes=_number(
                env, "QUEUE_BASE_INTERVAL_RETRY", 5.0, BASE_INTERVAL_MINUTES
            ),
            poll_interval_seconds=_number(env, "SQLA_QUEUE_POLL_INTERVAL", 1.0, WAIT_SECONDS),
            listen_fallback_seconds=_number(env, "QUEUE_WAIT_NOTIFY_INTERVAL", 5.0, WAIT_SECONDS),
            log_debug=env.get("LOG_DEBUG", "").strip().upper() in ("TRUE", "1", "YES"),
            grafana_url=env.get("GRAFANA_URL", "").strip() or None,
            env=(env.get("ENV", "").strip() or "DEV").upper(),
            task_locks=_flag(env, "SQLA_QUEUE_TASK_LOCKS", default=True),
            nsj_locks=_flag(env, "SQLA_QUEUE_NSJ_LOCKS", default=False),
            tenants=TenantSettings.from_env(env),
            server=ServerSettings.from_env(env),
            environment=_queue_environment(env),
        )


def _queue_environment(env: Mapping[str, str]) -> QueueEnvironment:
    from .sources import QueueEnvironment  # the catalogue imports this module's ranges

    return QueueEnvironment.from_env(env)


# ------------------------------------------------------ multi-database tenants
#: the seed's defaults (nsj-queue-lib settings.py:63-71)
DEFAULT_CREDENTIALS_URL = "https://api.sre.nasajon.com.br/erp/credentials"
DEFAULT_OAUTH_TOKEN_URL = (
    "https://auth.nasajon.com.br/auth/realms/master/protocol/openid-connect/token"
)


@dataclass(frozen=True)
class TenantSettings:
    """The multi-database variables. Secrets stay out of ``repr``."""

    multi_database: bool = False
    url_template: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    client_id: str | None = None
    credentials_url: str = DEFAULT_CREDENTIALS_URL
    token_url: str = DEFAULT_OAUTH_TOKEN_URL
    driver: str = "postgresql"
    credentials_ttl_seconds: float = 300.0
    max_engines: int = 32
    http_timeout_seconds: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TenantSettings:
        env = os.environ if env is None else env
        return cls(
            multi_database=_flag(env, "MULTI_DATABASE", default=False),
            url_template=_first(env, "SQLA_QUEUE_TENANT_URL_TEMPLATE"),
            user=_first(env, "MULTI_DATABASE_USER"),
            password=_first(env, "MULTI_DATABASE_PASSWORD"),
            client_id=_first(env, "MULTI_DATABASE_CLIENT_ID"),
            # the seed's spelling first, then the correct one
            credentials_url=_first(
                env, "MULTI_DATABASE_API_CREDETIALS_URL", "MULTI_DATABASE_API_CREDENTIALS_URL"
            )
            or DEFAULT_CREDENTIALS_URL,
            token_url=_first(env, "OAUTH_TOKEN_URL") or DEFAULT_OAUTH_TOKEN_URL,
            driver=_first(env, "SQLA_QUEUE_TENANT_DRIVER") or "postgresql",
            credentials_ttl_seconds=_number(
                env, "SQLA_QUEUE_TENANT_CREDENTIALS_TTL", 300.0, CREDENTIALS_TTL
            ),
            max_engines=int(_number(env, "SQLA_QUEUE_TENANT_ENGINES", 32, TENANT_ENGINES)),
            http_timeout_seconds=_number(env, "SQLA_QUEUE_TENANT_HTTP_TIMEOUT", 10.0, HTTP_TIMEOUT),
        )


# ------------------------------------------------------ client-server mode
#: a shared secret shorter than this is refused: it is all that keeps
#: strangers from taking the locks
SECRET_MIN_LENGTH = 16


@dataclass(frozen=True)
class ServerSettings:
    """The socket server's variables, for the server and for its clients
    (the workers in client-server mode). The secret stays out of ``repr``.

    ``keepalive_seconds`` is the seed's ``LOCK_SERVICE_WAIT_CONN_INTERVAL``,
    which was the lock service's select() timeout: here it is how long a
    connection may stay silent before the server and the clients probe the
    peer (TCP keepalive and pings), so a peer that vanished without closing
    its socket loses its locks within about twice this.

    ``max_clients`` bounds the *authenticated* connections; the ones still
    in their TLS handshake or authentication have caps of their own
    (``max_unauthenticated`` in all, ``max_unauthenticated_per_address``
    from one address) and ``auth_timeout_seconds`` from their accept to
    authenticate (docs/client-server.md, "Strangers")."""

    enabled: bool = False
    host: str = "127.0.0.1"
    notify_port: int = 8770
    lock_port: int = 8970
    message_timeout_seconds: float = 5.0
    max_clients: int = 50
    max_unauthenticated: int = 64
    max_unauthenticated_per_address: int = 16
    auth_timeout_seconds: float = 3.0
    check_tasks_interval_seconds: float = 15.0
    keepalive_seconds: float = 30.0
    secret: str | None = field(default=None, repr=False)
    #: clients: connect with TLS (verified against the system's CAs or tls_ca)
    tls: bool = False
    tls_ca: str | None = None
    #: the server: serve TLS with this certificate chain and key
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServerSettings:
        env = os.environ if env is None else env
        host = (env.get("SERVER_HOST") or "127.0.0.1").strip()
        if not host or any(ch.isspace() for ch in host):
            raise ConfigurationError(f"SERVER_HOST must be a host name, not {env['SERVER_HOST']!r}")
        tls_ca = _first(env, "SQLA_QUEUE_SERVER_TLS_CA")
        settings = cls(
            enabled=_flag(env, "CLIENT_SERVER_MODE", default=False),
            host=host,
            notify_port=int(_number(env, "NOTIFY_SERVICE_PORT", 8770, PORT)),
            lock_port=int(_number(env, "LOCK_SERVICE_PORT", 8970, PORT)),
            message_timeout_seconds=_number(env, "TIMEOUT_SOCKET_MESSAGE", 5.0, SOCKET_SECONDS),
            max_clients=int(_number(env, "MAX_CLIENT_THREADS", 50, MAX_CLIENTS)),
            max_unauthenticated=int(
                _number(env, "SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED", 64, MAX_UNAUTHENTICATED)
            ),
            max_unauthenticated_per_address=int(
                _number(
                    env,
                    "SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED_PER_ADDRESS",
                    16,
                    MAX_UNAUTHENTICATED,
                )
            ),
            auth_timeout_seconds=_number(
                env, "SQLA_QUEUE_SERVER_AUTH_TIMEOUT", 3.0, SOCKET_SECONDS
            ),
            check_tasks_interval_seconds=_number(env, "CHECK_TASKS_INTERVAL", 15.0, CHECK_SECONDS),
            keepalive_seconds=_number(
                env, "LOCK_SERVICE_WAIT_CONN_INTERVAL", 30.0, KEEPALIVE_SECONDS
            ),
            secret=env.get("SQLA_QUEUE_SERVER_SECRET") or None,
            tls=_flag(env, "SQLA_QUEUE_SERVER_TLS", default=False) or tls_ca is not None,
            tls_ca=tls_ca,
            tls_cert=_first(env, "SQLA_QUEUE_SERVER_TLS_CERT"),
            tls_key=_first(env, "SQLA_QUEUE_SERVER_TLS_KEY"),
        )
        if settings.enabled:
            settings.secret_bytes()  # a worker without the secret stops at start
        return settings

    def secret_bytes(self) -> bytes:
        """The shared secret, or one line saying how to set it (never its value)."""
        secret = self.secret or ""
        if len(secret) < SECRET_MIN_LENGTH:
            problem = "is not set" if not secret else "is too short"
            raise ConfigurationError(
                f"SQLA_QUEUE_SERVER_SECRET {problem}: the queue server and its clients need "
                f"the same secret of at least {SECRET_MIN_LENGTH} characters"
            )
        try:
            return secret.encode()
        except UnicodeEncodeError:
            # bytes that are not UTF-8 in the environment arrive as lone surrogates
            raise ConfigurationError(
                "SQLA_QUEUE_SERVER_SECRET is not valid UTF-8: use printable text, for example "
                "the output of `openssl rand -hex 32`"
            ) from None
