"""Multi-database tenants: each task's handler gets a Session on its tenant's database.

The queue stays in one database; the work of a task whose ``tenant`` is 47
goes to tenant 47's own database (the seed's ``multi_db_conn``). A
:class:`TenantResolver` turns a tenant into a database URL:

* :class:`UrlTemplateResolver` — ``"postgresql://app@db/erp_{tenant}"``;
* :class:`MappingResolver` — ``{47: "postgresql://…", 48: "mysql://…"}``;
* :class:`CredentialsApiResolver` — the seed's credentials API, behind an
  OAuth password grant (and its refresh).

:class:`TenantEngines` keeps one engine per tenant, at most ``max_size`` of
them (the least recently used is disposed), and disposes them all when the
worker stops. For an async worker (``asynchronous=True``) they are async
engines (the database's async driver) and the handler's tenant session an
``AsyncSession`` (:meth:`TenantEngines.async_session`). See
``docs/tenants.md`` for the commit order and what a crash between the two
commits does.

Secrets (passwords, tokens) never reach a log line, an exception text or a
row: errors name the tenant, the endpoint and the HTTP status only, and the
URLs' ``repr`` hides the password (SQLAlchemy's ``URL`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import string
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from ..common.exceptions import ConfigurationError, SqlaQueueError
from ..common.redaction import redact
from ..config.ranges import CREDENTIALS_TTL, HTTP_TIMEOUT, TENANT_ENGINES
from ..config.settings import (
    _DRIVERS,
    TenantSettings,
    make_async_engine,
    make_engine,
    normalize_url,
)

if TYPE_CHECKING:
    import requests

__all__ = [
    "CredentialsApiResolver",
    "MappingResolver",
    "TenantEngines",
    "TenantError",
    "TenantResolver",
    "UrlTemplateResolver",
    "resolver_from_settings",
]

logger = logging.getLogger("sqla_queue.client.tenants")

#: the access token is renewed this many seconds before it expires (the seed's 10)
EXPIRY_MARGIN_SECONDS = 10.0


class TenantError(SqlaQueueError):
    """The tenant's database could not be resolved or reached."""

    #: the HTTP status that caused it, if any
    status: int | None = None


@runtime_checkable
class TenantResolver(Protocol):
    """Turns a task's tenant into the URL of the tenant's database."""

    def database_url(self, tenant: int) -> URL: ...


def _tenant_number(tenant: object) -> int:
    # bool is an int to Python, never a tenant
    if isinstance(tenant, bool) or not isinstance(tenant, int):
        raise TenantError(f"a tenant must be a whole number, not {type(tenant).__name__}")
    return tenant


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


# ------------------------------------------------------------------ resolvers
class UrlTemplateResolver:
    """``UrlTemplateResolver("postgresql://app:pw@db/erp_{tenant}")``: the
    template's only field is ``{tenant}``, formatted as a whole number, so a
    tenant can never inject anything into the URL."""

    def __init__(self, template: str) -> None:
        if not isinstance(template, str) or not template:
            raise ConfigurationError("a tenant URL template must be a non-empty string")
        try:
            fields = [
                (name, spec, conversion)
                for _, name, spec, conversion in string.Formatter().parse(template)
                if name is not None
            ]
        except ValueError as exc:
            raise ConfigurationError(f"invalid tenant URL template: {exc}") from None
        if not fields or any(field != ("tenant", "", None) for field in fields):
            raise ConfigurationError(
                "a tenant URL template must contain {tenant} and no other field, "
                f"e.g. postgresql://app@db/erp_{{tenant}}; got {redact(template)!r}"
            )
        self._template = template
        normalize_url(template.format(tenant=0))  # a malformed URL fails now

    def database_url(self, tenant: int) -> URL:
        return normalize_url(self._template.format(tenant=_tenant_number(tenant)))

    def __repr__(self) -> str:
        return f"UrlTemplateResolver({redact(self._template)!r})"


class MappingResolver:
    """``MappingResolver({47: "postgresql://…/erp_47", 48: URL(...)})``."""

    def __init__(self, urls: Mapping[int, str | URL]) -> None:
        self._urls = {_tenant_number(tenant): normalize_url(url) for tenant, url in urls.items()}

    def database_url(self, tenant: int) -> URL:
        try:
            return self._urls[_tenant_number(tenant)]
        except KeyError:
            raise TenantError(f"no database is configured for tenant {tenant}") from None

    def __repr__(self) -> str:
        return f"MappingResolver({ {t: _shown(u) for t, u in self._urls.items()}!r})"


@dataclass
class _Token:
    access: str
    expires_at: float
    refresh: str | None
    refresh_expires_at: float

    def __repr__(self) -> str:  # never the tokens themselves
        return f"_Token(expires_at={self.expires_at}, refresh_expires_at={self.refresh_expires_at})"


def _check_http_url(name: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"{name} must be an http(s) URL, not {redact(url)!r}")
    return url


def _driver(driver: str) -> str:
    """``postgresql``, ``mysql+pymysql``… or the seed's ``POSTGRES`` / ``MYSQL``."""
    name = _DRIVERS.get(driver.upper(), driver)
    try:
        url = normalize_url(URL.create(name, host="h", database="d"))
        url.get_dialect()  # an unknown dialect fails here, not at the first task
        return url.drivername
    except Exception:
        raise ConfigurationError(f"unknown tenant database driver {driver!r}") from None


class CredentialsApiResolver:
    """The seed's credentials API.

    An OAuth password grant to ``token_url`` (form: username, password,
    client_id, ``scope=offline_access``, ``grant_type=password``) gives an
    access token, kept until ``expires_in - 10`` s; after that the refresh
    token is used while it is valid, else a new password grant. Then ``POST
    credentials_url`` with ``{"tenant": n}`` and ``Authorization: Bearer``
    answers ``hostname, port, db_name, user, password``, which become a URL
    for ``driver`` (any driver sqla-queue supports; the reference forced
    PostgreSQL), cached ``credentials_ttl`` seconds. ``clock`` (monotonic
    seconds) is injectable for tests. Thread-safe: lanes share one resolver."""

    def __init__(
        self,
        *,
        user: str,
        password: str,
        client_id: str,
        credentials_url: str = TenantSettings.credentials_url,
        token_url: str = TenantSettings.token_url,
        driver: str = "postgresql",
        credentials_ttl: float = 300.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        http: requests.Session | None = None,
    ) -> None:
        missing = [
            name
            for name, value in (
                ("MULTI_DATABASE_USER", user),
                ("MULTI_DATABASE_PASSWORD", password),
                ("MULTI_DATABASE_CLIENT_ID", client_id),
            )
            if not value
        ]
        if missing:
            raise ConfigurationError(
                f"the tenant credentials API needs {', '.join(missing)} "
                "(or set SQLA_QUEUE_TENANT_URL_TEMPLATE, or a worker's tenant_resolver)"
            )
        self.user = user
        self._password = password
        self.client_id = client_id
        self.credentials_url = _check_http_url("MULTI_DATABASE_API_CREDETIALS_URL", credentials_url)
        self.token_url = _check_http_url("OAUTH_TOKEN_URL", token_url)
        self.driver = _driver(driver)
        self.credentials_ttl = CREDENTIALS_TTL.check("credentials_ttl", credentials_ttl)
        self.timeout = HTTP_TIMEOUT.check("timeout", timeout)
        self.clock = clock
        if http is None:
            import requests  # only a worker with this resolver pays for it

            http = requests.Session()
        self._http = http
        self._token: _Token | None = None
        self._token_lock = threading.Lock()
        self._credentials: dict[int, tuple[float, URL]] = {}
        self._credentials_lock = threading.Lock()
        self._tenant_locks: dict[int, threading.Lock] = {}

    def __repr__(self) -> str:
        return (
            f"CredentialsApiResolver(user={self.user!r}, client_id={self.client_id!r}, "
            f"credentials_url={redact(self.credentials_url)!r}, driver={self.driver!r})"
        )

    # -------------------------------------------------------------- tokens
    def _post(self, what: str, url: str, **kwargs: Any) -> dict[str, Any]:
        import requests

        # the URL may carry a password (https://user:pass@auth/...): errors
        # and the log lines that quote them show it masked
        shown = redact(url)
        try:
            response = self._http.post(url, timeout=self.timeout, allow_redirects=False, **kwargs)
        except requests.RequestException as exc:
            # the exception's text names the URL, never the body we sent
            raise TenantError(f"{what}: {shown} unreachable ({type(exc).__name__})") from None
        if response.status_code != 200:
            error = TenantError(f"{what}: {shown} answered HTTP {response.status_code}")
            error.status = response.status_code
            raise error
        try:
            body = response.json()
        except ValueError:
            raise TenantError(f"{what}: {shown} answered something that is not JSON") from None
        if not isinstance(body, dict):
            raise TenantError(f"{what}: {shown} answered JSON that is not an object")
        return body

    def _grant(self, form: dict[str, str], what: str) -> _Token:
        body = self._post(
            what,
            self.token_url,
            data=form,
            headers={"Accept": "application/json"},
        )
        now = self.clock()
        try:
            access = str(body["access_token"])
            expires_in = float(body["expires_in"])
            refresh = body.get("refresh_token")
            refresh_in = float(body.get("refresh_expires_in") or 0)
        except (KeyError, TypeError, ValueError):
            raise TenantError(
                f"{what}: {redact(self.token_url)} answered no access_token / expires_in"
            ) from None
        return _Token(
            access=access,
            expires_at=now + expires_in - EXPIRY_MARGIN_SECONDS,
            refresh=str(refresh) if refresh else None,
            refresh_expires_at=now + refresh_in - EXPIRY_MARGIN_SECONDS,
        )

    def access_token(self) -> str:
        """A valid access token: the cached one, a refreshed one, or a new grant."""
        with self._token_lock:
            token, now = self._token, self.clock()
            if token is not None and now < token.expires_at:
                return token.access
            if token is not None and token.refresh and now < token.refresh_expires_at:
                try:
                    self._token = self._grant(
                        {
                            "grant_type": "refresh_token",
                            "refresh_token": token.refresh,
                            "client_id": self.client_id,
                            "scope": "offline_access",
                        },
                        "token refresh",
                    )
                    return self._token.access
                except TenantError as exc:
                    logger.warning("%s; trying a new password grant", exc)
            self._token = None
            self._token = self._grant(
                {
                    "username": self.user,
                    "password": self._password,
                    "client_id": self.client_id,
                    "scope": "offline_access",
                    "grant_type": "password",
                },
                "password grant",
            )
            return self._token.access

    def forget_token(self) -> None:
        with self._token_lock:
            self._token = None

    # -------------------------------------------------------- credentials
    def database_url(self, tenant: int) -> URL:
        tenant = _tenant_number(tenant)
        with self._credentials_lock:  # one call per tenant at a time, tenants in parallel
            lock = self._tenant_locks.setdefault(tenant, threading.Lock())
        with lock:
            cached = self._credentials.get(tenant)
            if cached is not None and self.clock() < cached[0]:
                return cached[1]
            url = self._fetch(tenant)
            if self.credentials_ttl > 0:
                self._credentials[tenant] = (self.clock() + self.credentials_ttl, url)
            return url

    def _fetch(self, tenant: int) -> URL:
        what = f"tenant {tenant} credentials"
        for attempt in (1, 2):
            headers = {
                "Authorization": f"Bearer {self.access_token()}",
                "Accept": "application/json",
            }
            try:
                body = self._post(
                    what, self.credentials_url, json={"tenant": tenant}, headers=headers
                )
                break
            except TenantError as exc:
                # a token revoked before its expiry: one more try with a new grant
                if attempt == 1 and exc.status == 401:
                    self.forget_token()
                    continue
                raise
        try:
            port = body.get("port")
            url = URL.create(
                self.driver,
                username=str(body["user"]),
                password=str(body["password"]),
                host=str(body["hostname"]),
                port=int(port) if port not in (None, "") else None,
                database=str(body["db_name"]),
            )
        except (KeyError, TypeError, ValueError):
            raise TenantError(
                f"{what}: {redact(self.credentials_url)} answered no hostname / port / db_name / "
                "user / password"
            ) from None
        logger.debug("%s: %s", what, _shown(url))
        return url


def resolver_from_settings(settings: TenantSettings) -> TenantResolver:
    """The resolver the environment asks for: ``SQLA_QUEUE_TENANT_URL_TEMPLATE``
    if set, else the credentials API (``MULTI_DATABASE_USER`` and company)."""
    if settings.url_template:
        return UrlTemplateResolver(settings.url_template)
    return CredentialsApiResolver(
        user=settings.user or "",
        password=settings.password or "",
        client_id=settings.client_id or "",
        credentials_url=settings.credentials_url,
        token_url=settings.token_url,
        driver=settings.driver,
        credentials_ttl=settings.credentials_ttl_seconds,
        timeout=settings.http_timeout_seconds,
    )


# -------------------------------------------------------------------- engines
class TenantEngines:
    """At most ``max_size`` engines, one per tenant, least recently used
    evicted and disposed; thread-safe. ``close()`` disposes them all.

    The resolver is asked on every use (the credentials API's answers are
    cached): when a tenant's URL changes (a rotated password), its engine is
    replaced. With ``asynchronous``, the engines are async engines, used
    from the event loop through :meth:`async_engine` and
    :meth:`async_session` and disposed by :meth:`aclose`."""

    def __init__(
        self,
        resolver: TenantResolver,
        *,
        max_size: int = 32,
        pool_size: int = 1,
        max_overflow: int = 4,
        asynchronous: bool = False,
    ) -> None:
        self.resolver = resolver
        self.max_size = int(TENANT_ENGINES.check("max tenant engines", max_size))
        self.pool_size = pool_size
        self.max_overflow = max_overflow
        self.asynchronous = asynchronous
        self._engines: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self._engines)

    def engine(self, tenant: int | None) -> Engine:
        """The tenant's engine (a sync one: ``asynchronous`` is off)."""
        number = _tenant_number_of(tenant)
        engine, stale = self._cached(number, self.resolver.database_url(number))
        for old in stale:  # connections in use finish, then close
            old.dispose()
        return engine  # type: ignore[no-any-return]

    async def async_engine(self, tenant: int | None) -> Any:
        """The tenant's ``AsyncEngine`` (``asynchronous`` is on). The
        resolver, which may call the credentials API, runs in a thread."""
        number = _tenant_number_of(tenant)
        url = await asyncio.to_thread(self.resolver.database_url, number)
        engine, stale = self._cached(number, url)
        for old in stale:
            await old.dispose()
        return engine

    def _cached(self, tenant: int, url: URL) -> tuple[Any, list[Any]]:
        """The tenant's engine for ``url`` (made if missing or stale), and
        the engines to dispose: replaced or evicted."""
        key = url.render_as_string(hide_password=False)
        stale: list[Any] = []
        with self._lock:
            if self._closed:
                raise TenantError("the worker is stopping: its tenant engines are closed")
            current = self._engines.get(tenant)
            if current is not None and current[0] == key:
                self._engines.move_to_end(tenant)
                return current[1], stale
            if current is not None:
                stale.append(current[1])
            engine = self._create(url)
            self._engines[tenant] = (key, engine)
            self._engines.move_to_end(tenant)
            while len(self._engines) > self.max_size:
                evicted, (_, old) = self._engines.popitem(last=False)
                logger.debug("tenant %s: engine evicted", evicted)
                stale.append(old)
            return engine, stale

    def _create(self, url: URL) -> Any:
        if self.asynchronous:
            try:
                return make_async_engine(
                    url, pool_size=self.pool_size, max_overflow=self.max_overflow
                )
            except ConfigurationError as exc:  # the task fails, not the worker
                raise TenantError(f"the tenant database URL: {exc}") from None
        return make_engine(
            url,
            pool_size=self.pool_size,
            max_overflow=self.max_overflow,
            error=TenantError,
            label="the tenant database URL",
        )

    @contextlib.contextmanager
    def session(self, tenant: int | None) -> Iterator[Session]:
        """A Session on the tenant's database, rolled back if the block
        raises and closed always; the caller commits."""
        session = Session(bind=self.engine(tenant), expire_on_commit=False)
        try:
            yield session
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextlib.asynccontextmanager
    async def async_session(self, tenant: int | None) -> AsyncIterator[Any]:
        """:meth:`session` for an async worker: an ``AsyncSession``."""
        from sqlalchemy.ext.asyncio import AsyncSession

        session = AsyncSession(bind=await self.async_engine(tenant), expire_on_commit=False)
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        finally:
            await session.close()

    def close(self) -> None:
        """Dispose every engine; later uses fail. Async engines left (the
        loop that used them has ended without :meth:`aclose`) are dropped
        without closing their connections, which no loop can await now."""
        engines = self._take_all()
        for engine in engines:
            if self.asynchronous:
                engine.sync_engine.dispose(close=False)
            else:
                engine.dispose()

    async def aclose(self) -> None:
        """Dispose every async engine, on the loop that used them; later
        uses fail."""
        for engine in self._take_all():
            await engine.dispose()

    def _take_all(self) -> list[Any]:
        with self._lock:
            self._closed = True
            engines = [engine for _, engine in self._engines.values()]
            self._engines.clear()
        return engines


def _tenant_number_of(tenant: int | None) -> int:
    if tenant is None:
        raise TenantError("the task has no tenant: a multi-database worker needs one")
    return _tenant_number(tenant)
