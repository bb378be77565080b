"""The settings catalogue: every setting, once, and how its value is found.

Each :class:`Setting` names its environment variables (the seed's first),
its row in the optional ``queue_configuration`` table (PEQ's name first),
its worker class attribute, its default, the values it accepts and what it
means. The same entries check values at start, resolve them with their
precedence, print them (``sqla-queue config show``) and write the settings
reference in docs/configuration.md (``python -m sqla_queue.config.reference``; a test
checks the page is current).

Precedence, highest first: an explicit argument (the worker class's
attribute, or a value given to ``run()``), the environment, the
``queue_configuration`` table, the default. A bad value anywhere stops the
worker at start with one line that names the setting as the user wrote it:
``QUEUE_PURGE_LIMIT``, ``queue_configuration.lease_duration`` or
``Faturar.lease_seconds``.

Some variables are read by their own modules (the database URL, tenants,
webhooks); the catalogue documents them with the rest, and the ranges they
are checked against are the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .kinds import Choice, Flag, Kind, Number, ScheduleKind, Text
from .ranges import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_FACTOR,
    BACKOFF_JITTER_SECONDS,
    BASE_INTERVAL_MINUTES,
    COMMIT_BUDGET_MS,
    DEAD_PEER_SECONDS,
    ITEM_DELAY_SECONDS,
    ITEM_TTL_MINUTES,
    LEASE_SECONDS,
    MAX_RETRY,
    PURGE_LIMIT,
    PURGE_MAX_AGE_DAYS,
    PURGE_ROUNDS,
    TIME_LIMIT_SECONDS,
    VACUUM_DEAD_TUPLES,
    WAIT_SECONDS,
)

__all__ = ["CATALOGUE", "PEQ_UNUSED", "Setting", "setting"]

#: PEQ's settings that sqla-queue accepts in the table and does not use
PEQ_UNUSED = {
    "audit_retention": "no audit log in sqla-queue",
    "cron_schedule_retention_audit_log": "no audit log in sqla-queue",
    "cron_schedule_retention_dead_letter": "one purge routine keeps both; see purge_schedule",
    "cron_vacuum": "vacuum is the database's (autovacuum)",
}


# ---------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    key: str
    group: str
    meaning: str
    env: tuple[str, ...] = ()
    kind: Kind | None = None
    default: Any = None
    #: how the reference shows the default, when the value itself does not say it
    default_text: str | None = None
    #: the worker class attribute (an explicit value wins over everything else)
    attribute: str | None = None
    #: setting_name values accepted in queue_configuration (PEQ's first)
    table: tuple[str, ...] = ()
    #: the Settings field that holds the environment's value (read by settings.py)
    settings_field: str | None = None
    #: "used", "not yet" (a later feature), "read, not used", "not read"
    status: str = "used"
    secret: bool = False
    #: resolved here (False: read by its own module, documented here)
    resolved: bool = True

    def show_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None:
            return "–"
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)


def _s(key: str, group: str, meaning: str, **options: Any) -> Setting:
    return Setting(key, group, meaning, **options)


_DB = "The database"
_RETRY = "Retries and the dead letter"
_LEASE = "Leases, time limits, delays"
_WAKE = "Wake-ups and locks"
_MAINT = "Maintenance routines"
_TENANT = "Multi-database tenants"
_OTHER = "Webhooks, logging, others"
_SOCKET = "Client-server mode (docs/client-server.md)"

CATALOGUE: tuple[Setting, ...] = (
    # ---- the database (settings.database_url reads these)
    _s(
        "url",
        _DB,
        "The database, as a SQLAlchemy URL. Wins over the `DB_*` variables.",
        env=("SQLA_QUEUE_URL",),
        resolved=False,
        secret=True,
    ),
    _s(
        "db_driver",
        _DB,
        "Database kind for the `DB_*` variables: `POSTGRES` or `POSTGRESQL` "
        "(psycopg 3), `MYSQL` or `MARIADB` (PyMySQL), `SINGLE_STORE` or `SINGLESTORE`, "
        "`SQLITE`. Case does not matter; any other value is an error.",
        env=("DB_DRIVER", "DATABASE_DRIVER"),
        default="POSTGRES",
        resolved=False,
    ),
    _s(
        "db_host",
        _DB,
        "Database host. Needed (with `DB_BASE`) unless the driver is `SQLITE`.",
        env=("DB_HOST", "DATABASE_HOST"),
        resolved=False,
    ),
    _s(
        "db_port",
        _DB,
        "Database port, 1 to 65535.",
        env=("DB_PORT", "DATABASE_PORT"),
        default_text="the driver's",
        resolved=False,
    ),
    _s(
        "db_base",
        _DB,
        "Database name; for `SQLITE`, the database file.",
        env=("DB_BASE", "DATABASE_NAME"),
        resolved=False,
    ),
    _s("db_user", _DB, "User.", env=("DB_USER", "DATABASE_USER"), resolved=False),
    _s(
        "db_pass",
        _DB,
        "Password. Empty means no password.",
        env=("DB_PASS", "DATABASE_PASS"),
        resolved=False,
        secret=True,
    ),
    _s(
        "queue_name",
        _DB,
        "Read, but not used: the NOTIFY channel is the model's "
        "`__queue_channel__`, else the table name.",
        env=("QUEUE_NAME",),
        status="read, not used",
        resolved=False,
    ),
    _s(
        "queue_table",
        _DB,
        "Read, but not used: the table is the worker's `model`.",
        env=("QUEUE_TABLE",),
        status="read, not used",
        resolved=False,
    ),
    _s(
        "queue_subscriber_table",
        _DB,
        "Not used: the subscriber table is the pub/sub worker's "
        "`subscriber_model` (docs/pubsub.md).",
        env=("QUEUE_SUBSCRIBER_TABLE",),
        status="read, not used",
        resolved=False,
    ),
    # ---- retries
    _s(
        "max_retry",
        _RETRY,
        "Attempts in all (PEQ: processings), before the dead-letter run.",
        env=("QUEUE_MAX_RETRY",),
        kind=Number(MAX_RETRY),
        default=100,
        attribute="max_retry",
        table=("max_retries", "max_retry"),
        settings_field="max_retry",
    ),
    _s(
        "retry_interval_minutes",
        _RETRY,
        "Linear policy: attempt *n+1* runs *n ×* this many "
        "minutes after attempt *n* failed. Fractions work (`0.5` is 30 s); `0` retries at once.",
        env=("QUEUE_BASE_INTERVAL_RETRY",),
        kind=Number(BASE_INTERVAL_MINUTES),
        default=5,
        attribute="retry_interval_minutes",
        table=("retry_interval_minutes",),
        settings_field="base_interval_retry_minutes",
    ),
    _s(
        "backoff",
        _RETRY,
        "The retry policy: `linear` (the seed's, above) or `exponential` "
        "(PEQ's: `backoff_base × backoff_factor ** n` seconds after the *n*-th failure, plus a "
        "random jitter between `backoff_jitter_min` and `backoff_jitter_max` seconds, at most "
        "30 days).",
        env=("SQLA_QUEUE_BACKOFF",),
        kind=Choice(("linear", "exponential")),
        default="linear",
        attribute="backoff_policy",
        table=("backoff_policy", "backoff"),
    ),
    _s(
        "backoff_base",
        _RETRY,
        "Exponential policy: the base delay.",
        env=("SQLA_QUEUE_BACKOFF_BASE",),
        kind=Number(BACKOFF_BASE_SECONDS),
        default=10,
        attribute="backoff_base_seconds",
        table=("backoff_base",),
    ),
    _s(
        "backoff_factor",
        _RETRY,
        "Exponential policy: the factor (1 keeps the delay constant).",
        env=("SQLA_QUEUE_BACKOFF_FACTOR",),
        kind=Number(BACKOFF_FACTOR),
        default=2,
        attribute="backoff_factor",
        table=("backoff_factor",),
    ),
    _s(
        "backoff_jitter_min",
        _RETRY,
        "Exponential policy: the least random seconds added.",
        env=("SQLA_QUEUE_BACKOFF_JITTER_MIN",),
        kind=Number(BACKOFF_JITTER_SECONDS),
        default=11,
        attribute="backoff_jitter_min_seconds",
        table=("backoff_jitter_min",),
    ),
    _s(
        "backoff_jitter_max",
        _RETRY,
        "Exponential policy: the most random seconds added (not less than `backoff_jitter_min`).",
        env=("SQLA_QUEUE_BACKOFF_JITTER_MAX",),
        kind=Number(BACKOFF_JITTER_SECONDS),
        default=99,
        attribute="backoff_jitter_max_seconds",
        table=("backoff_jitter_max",),
    ),
    # ---- leases, limits, delays
    _s(
        "lease_seconds",
        _LEASE,
        "How long a claim lasts without a heartbeat (PEQ's "
        "`lease_duration`). The heartbeat renews it every third of it while the handler runs; "
        "a task whose lease expired is rescued.",
        env=("SQLA_QUEUE_LEASE_SECONDS",),
        kind=Number(LEASE_SECONDS),
        default=30,
        attribute="lease_seconds",
        table=("lease_duration", "lease_seconds"),
    ),
    _s(
        "commit_budget",
        _LEASE,
        "Milliseconds a finished task's outcome may wait for its commit: a lane commits the "
        "outcomes of quick tasks together once the oldest has waited this long, and never keeps "
        "one waiting for a slow neighbour (docs/lifecycle.md#the-batch-transaction). "
        "0: each task commits alone.",
        env=("SQLA_QUEUE_COMMIT_BUDGET_MS",),
        kind=Number(COMMIT_BUDGET_MS),
        default=10,
        attribute="commit_budget_ms",
        table=("commit_budget_ms",),
    ),
    _s(
        "dead_peer",
        _LEASE,
        "Seconds after which a worker cut off by the network holds nothing: the database ends "
        "its sessions (their locks and open transactions) and its routine locks lapse, and the "
        "worker itself sees its connections fail (docs/lifecycle.md#network-partitions). "
        "`auto`: twice `lease_seconds`, at least 10 (a short test lease does not make a loaded "
        "machine's pauses look like a cut).",
        env=("SQLA_QUEUE_DEAD_PEER_SECONDS",),
        kind=Number(DEAD_PEER_SECONDS, none_words=("auto",)),
        default=None,
        default_text="auto",
        attribute="dead_peer_seconds",
        table=("dead_peer_seconds",),
    ),
    _s(
        "time_limit",
        _LEASE,
        "The longest a handler may run; past it the handler is "
        "abandoned, its work rolled back, and the attempt fails (docs/lifecycle.md#time-limits). "
        "`none`: no limit.",
        env=("SQLA_QUEUE_TIME_LIMIT",),
        kind=Number(TIME_LIMIT_SECONDS, none_words=("none", "off")),
        default=None,
        default_text="none",
        attribute="time_limit_seconds",
        table=("time_limit",),
    ),
    _s(
        "item_delay",
        _LEASE,
        "A task becomes claimable this many seconds after its time "
        "(PEQ's `item_delay`): a short pause before new work is taken.",
        env=("SQLA_QUEUE_ITEM_DELAY",),
        kind=Number(ITEM_DELAY_SECONDS),
        default=0,
        attribute="item_delay_seconds",
        table=("item_delay",),
    ),
    _s(
        "item_ttl",
        _LEASE,
        "A task still `pendente` this many minutes after its time goes to "
        "the dead letter (PEQ's `item_ttl`; PEQ's default is 4320, three days). `0`: never.",
        env=("SQLA_QUEUE_ITEM_TTL",),
        kind=Number(ITEM_TTL_MINUTES),
        default=0,
        attribute="item_ttl_minutes",
        table=("item_ttl",),
    ),
    # ---- wake-ups and locks
    _s(
        "wait_notify_interval",
        _WAKE,
        "Seconds. PostgreSQL: the longest an idle lane waits for "
        "a NOTIFY before it looks for work anyway; every database: a `pendente` task older "
        "than this is re-notified by the schedule routine. (The seed's default was 30.)",
        env=("QUEUE_WAIT_NOTIFY_INTERVAL",),
        kind=Number(WAIT_SECONDS),
        default=5,
        table=("wait_notify_interval",),
        settings_field="listen_fallback_seconds",
    ),
    _s(
        "poll_interval",
        _WAKE,
        "Seconds. MySQL, MariaDB, SingleStore and SQLite: how often an idle lane looks for work.",
        env=("SQLA_QUEUE_POLL_INTERVAL",),
        kind=Number(WAIT_SECONDS),
        default=1,
        table=("poll_interval",),
        settings_field="poll_interval_seconds",
    ),
    _s(
        "task_locks",
        _WAKE,
        "PostgreSQL and MariaDB: a per-task advisory lock / `GET_LOCK` at "
        "claim time, so the rescue sees a killed worker at once (the lease covers it anyway). "
        "`false` behind a transaction-pooling PgBouncer (docs/pgbouncer.md).",
        env=("SQLA_QUEUE_TASK_LOCKS",),
        kind=Flag(),
        default=True,
        attribute="task_locks",
        settings_field="task_locks",
    ),
    # ---- maintenance routines
    _s(
        "maintenance",
        _MAINT,
        "`false`: this worker runs no maintenance routine (the others "
        "of the queue do; the start-up rescue still runs).",
        env=("SQLA_QUEUE_MAINTENANCE",),
        kind=Flag(),
        default=True,
        attribute="maintenance",
    ),
    _s(
        "rescue_schedule",
        _MAINT,
        "When the rescue runs (re-enqueues tasks whose worker is "
        "gone). Default: every half lease, faster than the seed's every 5 minutes.",
        env=("QUEUE_MINUTE_RETRY_THREAD", "SQLA_QUEUE_RESCUE_CRON"),
        kind=ScheduleKind(),
        default=None,
        default_text="every half lease (`@every 15s`)",
        table=("cron_schedule_retention_queue", "rescue_schedule"),
    ),
    _s(
        "schedule_schedule",
        _MAINT,
        "When due `agendada` tasks become `pendente` and old "
        "`pendente` ones are re-notified. Default every second (the seed: every 5 minutes), "
        "so a retry runs about on time.",
        env=("QUEUE_MINUTE_NOTIFY_THREAD", "SQLA_QUEUE_SCHEDULE_CRON"),
        kind=ScheduleKind(),
        default="@every 1s",
        table=("schedule_schedule",),
    ),
    _s(
        "purge_schedule",
        _MAINT,
        "When the purge runs. The seed's default: minute 0 of every hour.",
        env=("QUEUE_MINUTE_PURGE_THREAD", "SQLA_QUEUE_PURGE_CRON"),
        kind=ScheduleKind(),
        default="0",
        table=("cron_schedule_retention_history", "purge_schedule"),
    ),
    _s(
        "ttl_schedule",
        _MAINT,
        "When the TTL routine runs (only with `item_ttl` set).",
        env=("SQLA_QUEUE_TTL_CRON",),
        kind=ScheduleKind(),
        default="@every 1m",
        table=("ttl_schedule",),
    ),
    _s(
        "vacuum_schedule",
        _MAINT,
        "When the vacuum routine looks at the queue table's dead tuples (PostgreSQL).",
        env=("SQLA_QUEUE_VACUUM_CRON",),
        kind=ScheduleKind(),
        default="@every 1m",
        table=("vacuum_schedule",),
    ),
    _s(
        "vacuum_dead_tuples",
        _MAINT,
        "PostgreSQL: the vacuum routine runs `VACUUM (ANALYZE)` on the queue table once it "
        "holds this many dead tuples, unless an old snapshot would keep them (then it logs "
        "a warning naming the holder). `0`: never.",
        env=("SQLA_QUEUE_VACUUM_DEAD_TUPLES",),
        kind=Number(VACUUM_DEAD_TUPLES),
        default=10_000,
        table=("vacuum_dead_tuples",),
    ),
    _s(
        "purge_max_age",
        _MAINT,
        "Days. A finished chain (every attempt and its dead-letter run) "
        "whose newest row is older than this is deleted by the purge. Fractions work.",
        env=("QUEUE_PURGE_MAX_AGE",),
        kind=Number(PURGE_MAX_AGE_DAYS),
        default=60,
        table=("history_retention", "purge_max_age"),
    ),
    _s(
        "dead_letter_retention",
        _MAINT,
        "Days, for chains that went to the dead letter "
        "(PEQ's `dead_letter_retention`, default 91 there). Default: `QUEUE_PURGE_MAX_AGE`.",
        env=("SQLA_QUEUE_DEAD_LETTER_RETENTION",),
        kind=Number(PURGE_MAX_AGE_DAYS),
        default=None,
        default_text="`QUEUE_PURGE_MAX_AGE`",
        table=("dead_letter_retention",),
    ),
    _s(
        "purge_limit",
        _MAINT,
        "Rows per purge chunk (one transaction, whole chains).",
        env=("QUEUE_PURGE_LIMIT",),
        kind=Number(PURGE_LIMIT),
        default=1000,
        table=("purge_limit",),
    ),
    _s(
        "purge_round_limit",
        _MAINT,
        "Chunks per purge round at most.",
        env=("QUEUE_PURGE_ROUND_LIMIT",),
        kind=Number(PURGE_ROUNDS),
        default=100,
        table=("purge_round_limit",),
    ),
    # ---- tenants (settings.TenantSettings reads these)
    _s(
        "multi_database",
        _TENANT,
        "`true`: handlers get a fifth argument, `tenant_session` (docs/tenants.md).",
        env=("MULTI_DATABASE",),
        default=False,
        resolved=False,
    ),
    _s(
        "tenant_url_template",
        _TENANT,
        "A database URL with `{tenant}`; when set, the credentials API is not used.",
        env=("SQLA_QUEUE_TENANT_URL_TEMPLATE",),
        resolved=False,
        secret=True,
    ),
    _s(
        "tenant_user",
        _TENANT,
        "The account for the OAuth password grant (credentials API).",
        env=("MULTI_DATABASE_USER",),
        resolved=False,
    ),
    _s(
        "tenant_password",
        _TENANT,
        "Its password. Never logged.",
        env=("MULTI_DATABASE_PASSWORD",),
        resolved=False,
        secret=True,
    ),
    _s(
        "tenant_client_id",
        _TENANT,
        "The OAuth `client_id`.",
        env=("MULTI_DATABASE_CLIENT_ID",),
        resolved=False,
    ),
    _s(
        "tenant_credentials_url",
        _TENANT,
        "The credentials API (the seed's spelling first).",
        env=("MULTI_DATABASE_API_CREDETIALS_URL", "MULTI_DATABASE_API_CREDENTIALS_URL"),
        default="https://api.sre.nasajon.com.br/erp/credentials",
        resolved=False,
    ),
    _s(
        "tenant_token_url",
        _TENANT,
        "The OAuth token endpoint.",
        env=("OAUTH_TOKEN_URL",),
        default="https://auth.nasajon.com.br/auth/realms/master/protocol/openid-connect/token",
        resolved=False,
    ),
    _s(
        "tenant_driver",
        _TENANT,
        "The driver of URLs built from the credentials API.",
        env=("SQLA_QUEUE_TENANT_DRIVER",),
        default="postgresql",
        resolved=False,
    ),
    _s(
        "tenant_credentials_ttl",
        _TENANT,
        "Seconds a tenant's credentials are reused, 0 to 86400.",
        env=("SQLA_QUEUE_TENANT_CREDENTIALS_TTL",),
        default=300,
        resolved=False,
    ),
    _s(
        "tenant_engines",
        _TENANT,
        "Engines kept open, one per tenant, 1 to 10,000.",
        env=("SQLA_QUEUE_TENANT_ENGINES",),
        default=32,
        resolved=False,
    ),
    _s(
        "tenant_http_timeout",
        _TENANT,
        "Seconds each call to the token endpoint or the "
        "credentials API may take, more than 0 and at most 300.",
        env=("SQLA_QUEUE_TENANT_HTTP_TIMEOUT",),
        default=10,
        resolved=False,
    ),
    # ---- others
    _s(
        "orm_fast_insert",
        _OTHER,
        "`session.add(Task(...))`: the flush hook writes the new tasks itself, with a Core "
        "INSERT per run of tasks giving the same columns, and hands each object to the "
        "session as a flushed one (docs/payload.md). `false`: the ORM's unit of work writes "
        "them.",
        env=("SQLA_QUEUE_ORM_FAST_INSERT",),
        kind=Flag(),
        default=True,
        resolved=False,
    ),
    _s(
        "libpq_insert",
        _OTHER,
        "PostgreSQL on psycopg 3: a task's INSERT (`insert_task`, the flush hook's) goes "
        "to libpq itself where nothing can differ from psycopg's cursor (docs/payload.md). "
        "`false`: psycopg's cursor runs it.",
        env=("SQLA_QUEUE_LIBPQ_INSERT",),
        kind=Flag(),
        default=True,
        resolved=False,
    ),
    _s(
        "webhook_timeout",
        _OTHER,
        "Seconds a webhook delivery may take in all (a wall-clock deadline: connecting, "
        "redirects and body included), more than 0 and at most 3600 (docs/webhooks.md).",
        env=("DEFAULT_WEBHOOK_TIMEOUT",),
        default=20,
        resolved=False,
    ),
    _s(
        "webhook_block_private",
        _OTHER,
        "`true`: webhooks refuse loopback, private, link-local and every other "
        "non-global destination, except `WEBHOOK_ALLOWED_NETWORKS`; `false` turns the "
        "guard off (docs/webhooks.md).",
        env=("WEBHOOK_BLOCK_PRIVATE_NETWORKS",),
        kind=Flag(),
        default=True,
        resolved=False,
    ),
    _s(
        "webhook_allowed_networks",
        _OTHER,
        "Addresses and CIDR ranges webhooks may reach with the guard on, comma-separated "
        "(`10.0.0.7, 192.168.10.0/24, fd00::/8`); a bad one stops the worker at start "
        "(docs/webhooks.md).",
        env=("WEBHOOK_ALLOWED_NETWORKS",),
        resolved=False,
    ),
    _s(
        "log_debug",
        _OTHER,
        "`true`, `1` or `yes`: the `sqla-queue worker` command logs at "
        "DEBUG level unless `--log-level` is given.",
        env=("LOG_DEBUG",),
        default=False,
        resolved=False,
    ),
    _s(
        "paused_processes",
        _OTHER,
        "Processes no worker claims: their tasks stay queued until resumed. Comma-separated "
        "`processo` values; written by `sqla-queue pause` / `resume` (and the dashboard); "
        "every worker reads it every 2 seconds ([operations.md](operations.md#pause-and-resume)).",
        kind=Text(),
        default="",
        default_text="none",
        table=("paused_processes",),
        resolved=False,
    ),
    _s(
        "periodic_runs",
        _OTHER,
        "The last occurrence enqueued of each periodic task of the queue (JSON, name to "
        "time); written by the workers' `periodic` routine in the transaction that "
        "enqueues the task, so each occurrence is enqueued once "
        "([periodic.md](periodic.md)). Not meant to be edited: deleting a name's entry "
        "starts it afresh.",
        kind=Text(),
        default="{}",
        default_text="none",
        table=("periodic_runs",),
        resolved=False,
    ),
    _s(
        "dashboard_user",
        _OTHER,
        "The user `sqla-queue dashboard` logs in "
        "([operations.md](operations.md#the-web-dashboard)).",
        env=("SQLA_QUEUE_DASHBOARD_USER",),
        default="admin",
        resolved=False,
    ),
    _s(
        "dashboard_password",
        _OTHER,
        "The password every page, API call and write of `sqla-queue dashboard` needs "
        "(requeue, cancel, retry now, pause). Unset: the dashboard does not start unless "
        "read-only (`SQLA_QUEUE_DASHBOARD_READ_ONLY`); there is no default password.",
        env=("SQLA_QUEUE_DASHBOARD_PASSWORD",),
        secret=True,
        resolved=False,
    ),
    _s(
        "dashboard_read_only",
        _OTHER,
        "`true` (or `--read-only`): the dashboard's pages and API need no login and every "
        "write is refused with 403.",
        env=("SQLA_QUEUE_DASHBOARD_READ_ONLY",),
        kind=Flag(),
        default=False,
        resolved=False,
    ),
    _s(
        "dashboard_allowed_hosts",
        _OTHER,
        "`Host` header names the dashboard accepts besides its bind address, `localhost`, "
        "`127.0.0.1` and `[::1]` (any port), comma-separated; also `--allowed-host`. "
        "`*.example.com` matches its subdomains, `*` any name. Others get 400.",
        env=("SQLA_QUEUE_DASHBOARD_ALLOWED_HOSTS",),
        default="",
        default_text="none",
        resolved=False,
    ),
    _s(
        "dashboard_behind_tls",
        _OTHER,
        "`true` (or `--behind-tls-proxy`): a TLS proxy is in front of the dashboard: its "
        "session cookie is Secure, and `X-Forwarded-For`/`-Proto` are read from the "
        "addresses in uvicorn's `FORWARDED_ALLOW_IPS` (default 127.0.0.1).",
        env=("SQLA_QUEUE_DASHBOARD_BEHIND_TLS",),
        kind=Flag(),
        default=False,
        resolved=False,
    ),
    _s(
        "dashboard_secret",
        _OTHER,
        "Obsolete: accepted and ignored. The dashboard keeps its sessions in its own memory "
        "and signs nothing (a restart logs everyone out).",
        env=("SQLA_QUEUE_DASHBOARD_SECRET",),
        secret=True,
        resolved=False,
    ),
    _s(
        "env",
        _OTHER,
        "The environment's name (upper-cased) in the label of the log lines pushed to "
        "`GRAFANA_URL`: `<ENV>_flask_api_skeleton=<env>_log`, the reference's "
        "([operations.md](operations.md#logs)).",
        env=("ENV",),
        default="DEV",
        settings_field="env",
        resolved=False,
    ),
    _s(
        "grafana_url",
        _OTHER,
        "Grafana Loki's push endpoint: the `sqla-queue worker` command also pushes every "
        "log line there, as JSON, in batches from a thread of its own "
        "([operations.md](operations.md#logs)). Unset: no push.",
        env=("GRAFANA_URL",),
        settings_field="grafana_url",
        secret=True,
        resolved=False,
    ),
    # ---- the queue server (the seed's socket server), read by settings.py
    _s(
        "client_server_mode",
        _SOCKET,
        "Workers: use the queue server for wake-ups and routine locks; per-task locks off, rescue "
        "by lease (docs/client-server.md).",
        env=("CLIENT_SERVER_MODE",),
        default=False,
        resolved=False,
    ),
    _s(
        "server_host",
        _SOCKET,
        "Workers: the queue server's host.",
        env=("SERVER_HOST",),
        default="127.0.0.1",
        resolved=False,
    ),
    _s(
        "notify_service_port",
        _SOCKET,
        "Both sides: the notify port (`--notify-port` for the server).",
        env=("NOTIFY_SERVICE_PORT",),
        default=8770,
        resolved=False,
    ),
    _s(
        "lock_service_port",
        _SOCKET,
        "Both sides: the lock port (`--lock-port`).",
        env=("LOCK_SERVICE_PORT",),
        default=8970,
        resolved=False,
    ),
    _s(
        "timeout_socket_message",
        _SOCKET,
        "Both sides: seconds a frame may take to arrive whole, a reply to come.",
        env=("TIMEOUT_SOCKET_MESSAGE",),
        default=5,
        resolved=False,
    ),
    _s(
        "max_client_threads",
        _SOCKET,
        "Server: authenticated connections served at once (the seed's listen backlog; here a "
        "real bound).",
        env=("MAX_CLIENT_THREADS",),
        default=50,
        resolved=False,
    ),
    _s(
        "server_max_unauthenticated",
        _SOCKET,
        "Server: connections not yet authenticated (TLS handshake included), in all; they do not "
        "count against `MAX_CLIENT_THREADS`. Over the cap, the oldest of the address that holds "
        "the most is dropped.",
        env=("SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED",),
        default=64,
        resolved=False,
    ),
    _s(
        "server_max_unauthenticated_per_address",
        _SOCKET,
        "Server: connections not yet authenticated from one address (an IPv6 /64 is one); over "
        "it, that address's oldest is dropped.",
        env=("SQLA_QUEUE_SERVER_MAX_UNAUTHENTICATED_PER_ADDRESS",),
        default=16,
        resolved=False,
    ),
    _s(
        "server_auth_timeout",
        _SOCKET,
        "Server: seconds a connection has, from its accept, to finish its TLS handshake and "
        "authenticate.",
        env=("SQLA_QUEUE_SERVER_AUTH_TIMEOUT",),
        default=3,
        resolved=False,
    ),
    _s(
        "check_tasks_interval",
        _SOCKET,
        "Server: seconds between its looks at the queue.",
        env=("CHECK_TASKS_INTERVAL",),
        default=15,
        resolved=False,
    ),
    _s(
        "lock_service_wait_conn_interval",
        _SOCKET,
        "Both sides: seconds of silence before a peer is probed; a vanished peer's locks go within"
        " about twice this.",
        env=("LOCK_SERVICE_WAIT_CONN_INTERVAL",),
        default=30,
        resolved=False,
    ),
    _s(
        "server_secret",
        _SOCKET,
        "Both sides: the shared secret, 16 characters or more. Required in client-server mode.",
        env=("SQLA_QUEUE_SERVER_SECRET",),
        default=None,
        secret=True,
        resolved=False,
    ),
    _s(
        "server_tls_cert",
        _SOCKET,
        "Server: serve TLS with this certificate chain (with `SQLA_QUEUE_SERVER_TLS_KEY`; both or "
        "neither).",
        env=("SQLA_QUEUE_SERVER_TLS_CERT",),
        default=None,
        resolved=False,
    ),
    _s(
        "server_tls_key",
        _SOCKET,
        "Server: the key of `SQLA_QUEUE_SERVER_TLS_CERT`.",
        env=("SQLA_QUEUE_SERVER_TLS_KEY",),
        default=None,
        resolved=False,
    ),
    _s(
        "server_tls",
        _SOCKET,
        "Workers: connect with TLS, verified against the system's CAs.",
        env=("SQLA_QUEUE_SERVER_TLS",),
        default=False,
        resolved=False,
    ),
    _s(
        "server_tls_ca",
        _SOCKET,
        "Workers: connect with TLS, verified against this CA file.",
        env=("SQLA_QUEUE_SERVER_TLS_CA",),
        default=None,
        resolved=False,
    ),
    # ---- read by their own modules
    _s(
        "nsj_locks",
        _WAKE,
        "PostgreSQL: also take nsj-queue-lib 1.2.2's task lock "
        "(`pg_try_advisory_lock(<task id>)`), so that its workers and sqla-queue's can share "
        "a queue (docs/coming-from-nsj-queue-lib.md). Needs task locks; on another database "
        "the worker stops with an error.",
        env=("SQLA_QUEUE_NSJ_LOCKS",),
        default=False,
        attribute="nsj_locks",
        resolved=False,
    ),
    _s(
        "spark_jars",
        _OTHER,
        "`sqla-queue spark ...`: JDBC driver jars, paths separated by `:` or `,`, instead of "
        "Debian's (docs/spark.md).",
        env=("SQLA_QUEUE_SPARK_JARS",),
        resolved=False,
    ),
)

_BY_KEY = {setting.key: setting for setting in CATALOGUE}
_BY_TABLE_NAME = {name: setting for setting in CATALOGUE for name in setting.table}


def setting(key: str) -> Setting:
    return _BY_KEY[key]
