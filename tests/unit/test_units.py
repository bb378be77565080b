"""Unit tests of the pure helpers: no database.

Payload text and hash (compatible with nsj-queue-lib), secret redaction,
configuration from the environment, the retry rule, ``TaskRecord`` and the
worker's adaptive batch size.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import uuid
from typing import ClassVar

import pytest
from sqlalchemy.engine import make_url

from sqla_queue import ConfigurationError, PayloadError, TaskRecord
from sqla_queue.common.payload import decode_payload, hash_payload, serialize_payload
from sqla_queue.common.redaction import MASK, fit_message, redact
from sqla_queue.config.settings import Settings
from sqla_queue.policies.retry import LinearBackoff
from sqla_queue.schema.mixins import COLUMN_NAMES
from sqla_queue.worker.runner import BatchLimit
from tests.conftest import SEED_COLUMNS, TABLE_COLUMNS

# sha256("conteúdo"), as nsj-queue-lib stored it (nsj-reference.md §3, OBS)
CONTEUDO_HASH = b"0263637886787eeaa9529fecbc8e63beda6bad2ef5e61c349ff719aad84075b8"
# printf '{"a": 1}' | sha256sum
A_1_HASH = b"f9d86028c6e0d64e225186f96acb69338b2c59764df79162107f5c4bb34d1310"


# ---------------------------------------------------------------- payload
class TestPayload:
    def test_dict_text_is_the_references_json_dumps(self) -> None:
        value = {"b": 1, "a": [1, 2], "nome": "João", "ok": True, "nada": None}
        text = serialize_payload(value)
        assert text == json.dumps(value, ensure_ascii=True)
        # default separators, insertion order, non-ASCII escaped
        assert text == ('{"b": 1, "a": [1, 2], "nome": "Jo\\u00e3o", "ok": true, "nada": null}')

    def test_str_payload_is_a_string_value(self) -> None:
        # plain text is kept verbatim; text that parses as JSON is quoted
        # (tests/integration/test_payload.py has the whole contract)
        assert serialize_payload("not json at all") == "not json at all"
        text = '{"a":1,  "b": "não é reformatado"}'
        assert serialize_payload(text) == json.dumps(text, ensure_ascii=True)
        assert decode_payload(serialize_payload(text)) == text

    def test_none_payload_stays_none(self) -> None:
        assert serialize_payload(None) is None

    def test_naive_datetime_without_microseconds_matches_reference_format(self) -> None:
        when = dt.datetime(2024, 5, 6, 7, 8, 9)
        text = serialize_payload({"quando": when})
        assert text == json.dumps({"quando": when.strftime("%Y-%m-%dT%H:%M:%S")}, ensure_ascii=True)
        assert text == '{"quando": "2024-05-06T07:08:09"}'

    def test_uuid_and_decimal_become_strings(self) -> None:
        ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
        text = serialize_payload({"id": ident, "valor": decimal.Decimal("10.50")})
        assert text == '{"id": "12345678-1234-5678-1234-567812345678", "valor": "10.50"}'

    @pytest.mark.parametrize(
        ("value", "mentions"),
        [
            ({"x": object()}, "object"),
            ({"tags": {1, 2}}, "set"),
            ({"n": float("nan")}, "Out of range float"),
            ({"n": float("inf")}, "Out of range float"),
            ({(1, 2): "tuple key"}, "tuple"),
            (b"raw bytes", "bytes"),
        ],
        ids=["object", "set", "nan", "inf", "tuple-key", "bytes"],
    )
    def test_unserialisable_value_raises_payload_error(self, value: object, mentions: str) -> None:
        with pytest.raises(PayloadError) as info:
            serialize_payload(value)
        message = str(info.value)
        assert "cannot be serialised to JSON" in message
        assert mentions in message

    def test_circular_payload_raises_payload_error(self) -> None:
        value: dict[str, object] = {}
        value["self"] = value
        with pytest.raises(PayloadError, match="Circular reference"):
            serialize_payload(value)

    def test_too_deeply_nested_payload_raises_payload_error(self) -> None:
        value: list[object] = []
        for _ in range(100_000):
            value = [value]
        with pytest.raises(PayloadError):
            serialize_payload(value)

    def test_hash_is_sha256_hex_digest_as_64_ascii_bytes(self) -> None:
        text = json.dumps({"a": 1}, ensure_ascii=True)
        digest = hash_payload(text)
        assert digest == hashlib.sha256(text.encode()).hexdigest().encode("ascii")
        assert digest == A_1_HASH
        assert isinstance(digest, bytes)
        assert len(digest) == 64

    def test_hash_of_non_ascii_text_matches_the_reference(self) -> None:
        assert hash_payload("conteúdo") == CONTEUDO_HASH

    @pytest.mark.parametrize("empty", [None, ""])
    def test_empty_payload_has_no_hash(self, empty: str | None) -> None:
        assert hash_payload(empty) is None

    def test_decode_returns_the_json_value(self) -> None:
        assert decode_payload('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
        assert decode_payload("7") == 7

    def test_decode_returns_text_that_is_not_json_unchanged(self) -> None:
        assert decode_payload("plain text") == "plain text"
        assert decode_payload("") == ""
        assert decode_payload(None) is None

    def test_serialize_then_decode_round_trips(self) -> None:
        value = {"n": 1, "l": ["x", {"y": False}], "s": "ação"}
        assert decode_payload(serialize_payload(value)) == value


# -------------------------------------------------------------- redaction
class TestRedaction:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            (
                "could not connect to postgresql://app:s3cr3t@db.local:5432/erp",
                "could not connect to postgresql://app:***@db.local:5432/erp",
            ),
            (
                "mysql+pymysql://root:hunter2@127.0.0.1/test failed",
                "mysql+pymysql://root:***@127.0.0.1/test failed",
            ),
            ("host=db password=s3cr3t dbname=erp", "host=db password=*** dbname=erp"),
            ('body {"password": "s3cr3t", "user": "x"}', 'body {"password": ***, "user": "x"}'),
            ("GET /x?token=abc123&page=2", "GET /x?token=***&page=2"),
            ("DB_PASS=s3cr3t", "DB_PASS=***"),
            ("api_key: XYZ", "api_key: ***"),
            ("client_secret=abc", "client_secret=***"),
            ("Authorization: Bearer eyJhbGciOi.abc.def", "Authorization: ***"),
            (
                "headers={'Authorization': 'Bearer eyJhbGciOi.abc.def'}",
                "headers={'Authorization': '***'}",
            ),
            ("Authorization: Basic dXNlcjpwYXNz", "Authorization: ***"),
            ("got 401 for Bearer eyJhbGciOi.abc.def", "got 401 for Bearer ***"),
        ],
        ids=[
            "pg-url",
            "mysql-url",
            "dsn",
            "json",
            "query-token",
            "db-pass",
            "api-key",
            "client-secret",
            "auth-bearer",
            "auth-in-dict",
            "auth-basic",
            "bare-bearer",
        ],
    )
    def test_secret_is_masked(self, text: str, expected: str) -> None:
        assert redact(text) == expected

    def test_text_without_secrets_is_unchanged(self) -> None:
        text = 'FATAL: password authentication failed for user "app" (tentativa 3)'
        assert redact(text) == text

    # Realistic texts with each kind of secret: (id, text, expected). Each
    # expected text keeps everything around the secret (host, port, names,
    # other parameters), so a mask that eats too much fails too.
    GAPS: ClassVar[list[tuple[str, str, str]]] = [
        (
            "url-password-with-at",
            "could not connect to postgresql://app:p@ss@db.example.com:5432/erp (timeout)",
            "could not connect to postgresql://app:***@db.example.com:5432/erp (timeout)",
        ),
        (
            "url-password-with-two-ats",
            "mysql+pymysql://root:a@b@c@10.0.0.5:3306/erp refused",
            "mysql+pymysql://root:***@10.0.0.5:3306/erp refused",
        ),
        (
            "url-password-with-colon-and-slash",
            "engine postgresql+psycopg://app:pa:ss/w0rd@db:5432/erp failed",
            "engine postgresql+psycopg://app:***@db:5432/erp failed",
        ),
        (
            "url-azure-login-with-at",
            "postgresql://app@erp-db:S3cr3t!@erp-db.postgres.database.azure.com/erp",
            "postgresql://app@erp-db:***@erp-db.postgres.database.azure.com/erp",
        ),
        (
            "url-empty-user",
            "redis://:hunter2@cache:6379/0 is down",
            "redis://:***@cache:6379/0 is down",
        ),
        (
            "url-multi-host",
            "postgresql://app:s3cr3t@h1:5432,h2:5432/erp?target_session_attrs=read-write",
            "postgresql://app:***@h1:5432,h2:5432/erp?target_session_attrs=read-write",
        ),
        (
            "url-quoted-next-to-an-email",
            "dsn='postgresql://app:p@ss@db/erp', owner='ops@example.com'",
            "dsn='postgresql://app:***@db/erp', owner='ops@example.com'",
        ),
        (
            "aws-access-key-id",
            "InvalidAccessKeyId: AKIAIOSFODNN7EXAMPLE does not exist (region us-east-1)",
            "InvalidAccessKeyId: AKIA*** does not exist (region us-east-1)",
        ),
        (
            "aws-session-key-id",
            "aws_access_key_id=ASIAY34FZKBOKMUTVV7A region=sa-east-1",
            "aws_access_key_id=ASIA*** region=sa-east-1",
        ),
        (
            "aws-secret-ini",
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nregion = us-east-1",
            "aws_secret_access_key = ***\nregion = us-east-1",
        ),
        (
            "aws-secret-env",
            "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY AWS_REGION=us-east-1",
            "AWS_SECRET_ACCESS_KEY=*** AWS_REGION=us-east-1",
        ),
        (
            "aws-secret-json",
            '{"AccessKeyId": "x", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG", "Expiration": "z"}',
            '{"AccessKeyId": "x", "SecretAccessKey": ***, "Expiration": "z"}',
        ),
        (
            "aws-presigned-url",
            "403 for https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F2024"
            "&X-Amz-Date=20240101T000000Z&X-Amz-Signature=9f0e1d2c3b4a",
            "403 for https://b.s3.amazonaws.com/k?X-Amz-Credential=***"
            "&X-Amz-Date=20240101T000000Z&X-Amz-Signature=***",
        ),
        (
            "azure-account-key",
            "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=Eby8vdM02xNOcqF/lqUw"
            "JPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
            "EndpointSuffix=core.windows.net",
            "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=***;"
            "EndpointSuffix=core.windows.net",
        ),
        (
            "azure-service-bus-key",
            "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=Root;"
            "SharedAccessKey=abc123def456ghi789=",
            "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=Root;"
            "SharedAccessKey=***",
        ),
        (
            "azure-sas-in-connection-string",
            "BlobEndpoint=https://acme.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02"
            "&ss=b&sp=rl&se=2026-01-01T00:00:00Z&sig=AbC%2Bd3f%3D;QueueEndpoint=q",
            "BlobEndpoint=https://acme.blob.core.windows.net/;SharedAccessSignature=***;"
            "QueueEndpoint=q",
        ),
        (
            "azure-sas-query",
            "GET https://acme.blob.core.windows.net/c/f.txt?sv=2022-11-02&sr=b&sp=r"
            "&sig=AbC%2Bd3f%3D&se=2026-01-01 -> 403",
            "GET https://acme.blob.core.windows.net/c/f.txt?sv=2022-11-02&sr=b&sp=r"
            "&sig=***&se=2026-01-01 -> 403",
        ),
        (
            "gcp-private-key",
            '{"type": "service_account", "project_id": "acme", "private_key": "-----BEGIN '
            "PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----"
            '\\n", "client_email": "svc@acme.iam.gserviceaccount.com"}',
            '{"type": "service_account", "project_id": "acme", "private_key": ***, '
            '"client_email": "svc@acme.iam.gserviceaccount.com"}',
        ),
        (
            "pem-private-key",
            "key file:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA "
            "PRIVATE KEY-----\nloaded",
            "key file:\n-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----\nloaded",
        ),
        ("x-api-key", "X-Api-Key: 9f8e7d6c5b4a (rejected)", "X-Api-Key: *** (rejected)"),
        (
            "x-api-key-in-dict",
            "headers={'X-API-KEY': '9f8e7d6c5b4a', 'Accept': 'application/json'}",
            "headers={'X-API-KEY': ***, 'Accept': 'application/json'}",
        ),
        (
            "x-functions-key",
            "x-functions-key: abcDEF== host: acme.azurewebsites.net",
            "x-functions-key: *** host: acme.azurewebsites.net",
        ),
        (
            "cookie",
            "Cookie: sessionid=abc123; csrftoken=xyz789; theme=dark",
            "Cookie: sessionid=***; csrftoken=***; theme=***",
        ),
        (
            "cookie-in-dict",
            "{'Cookie': 'sessionid=abc123; theme=dark', 'Host': 'example.com'}",
            "{'Cookie': 'sessionid=***; theme=***', 'Host': 'example.com'}",
        ),
        (
            "set-cookie",
            "Set-Cookie: sessionid=abc123; Path=/; HttpOnly; Expires=Wed, 21 Oct 2026 07:28:00 GMT",
            "Set-Cookie: sessionid=***; Path=/; HttpOnly; Expires=Wed, 21 Oct 2026 07:28:00 GMT",
        ),
        (
            "query-password",
            "GET /login?user=bob&password=hunter2&next=/home 302",
            "GET /login?user=bob&password=***&next=/home 302",
        ),
        (
            "query-token-not-first",
            "GET /feed?page=2&token=abc123&lang=pt-BR 401",
            "GET /feed?page=2&token=***&lang=pt-BR 401",
        ),
    ]

    @pytest.mark.parametrize(
        ("text", "expected"), [case[1:] for case in GAPS], ids=[case[0] for case in GAPS]
    )
    def test_cloud_keys_cookies_and_odd_passwords_are_masked(
        self, text: str, expected: str
    ) -> None:
        assert redact(text) == expected

    @pytest.mark.parametrize(
        "text",
        [
            "GET http://api.local:8080/users?email=ana@example.com -> 404",
            "see https://registry.npmjs.org/@types/node and mail admin@example.com",
            "invalid signature: expected sha256, got md5",
            "design=minimal config=prod signed=true",
            "AKIA is the prefix of an access key id",
            "Cookies are disabled; Set the header yourself",
            "retry 3 of 5 at 2026-01-01T10:00:00Z for postgresql://db.local:5432/erp",
        ],
    )
    def test_nearby_text_without_secrets_is_unchanged(self, text: str) -> None:
        assert redact(text) == text

    def test_url_user_and_host_are_kept_around_an_at_password(self) -> None:
        masked = redact("postgresql://user:p@ss@host/db")
        assert masked == "postgresql://user:***@host/db"
        assert "ss" not in masked.replace("host", "")

    @pytest.mark.parametrize("name", ["MULTI_DATABASE_PASSWORD", "PGPASSWORD"])
    def test_prefixed_password_variable_is_masked(self, name: str) -> None:
        assert redact(f"{name}=s3cr3t") == f"{name}={MASK}"

    def test_fit_message_keeps_the_suffix_within_the_limit(self) -> None:
        suffix = ". Tarefa reenfileirada."
        message = fit_message("x" * 1000, 500, suffix)
        assert len(message) == 500
        assert message.endswith("x…" + suffix)
        assert message.startswith("xxx")

    def test_fit_message_leaves_a_short_text_whole(self) -> None:
        assert fit_message("boom", 500, ". Tarefa reenfileirada.") == (
            "boom. Tarefa reenfileirada."
        )

    def test_fit_message_redacts_before_cutting(self) -> None:
        message = fit_message("token=abcdef " + "y" * 600, 500, ". Máximo de tentativas atingido.")
        assert message.startswith("token=*** yyy")
        assert "abcdef" not in message
        assert len(message) == 500
        assert message.endswith(". Máximo de tentativas atingido.")


# --------------------------------------------------------------- settings
MAX_RETRY_RANGE = "must be a whole number from 1 to 1000000"
MINUTES = "must be a number of minutes from 0 to 1440"
SECONDS = "must be a number of seconds greater than 0 and at most 86400"
DB_ENV = {
    "DB_HOST": "db.example",
    "DB_PORT": "5433",
    "DB_BASE": "erp",
    "DB_USER": "app",
    "DB_PASS": "p@ss:w/rd",
}


class TestSettings:
    def test_defaults_with_an_empty_environment(self) -> None:
        settings = Settings.from_env({})
        assert settings == Settings(
            url=None,
            queue_name=None,
            queue_table=None,
            max_retry=100,
            base_interval_retry_minutes=5.0,
            poll_interval_seconds=1.0,
            listen_fallback_seconds=5.0,
            log_debug=False,
        )

    def test_sqla_queue_url_wins_over_db_variables(self) -> None:
        settings = Settings.from_env(
            {"SQLA_QUEUE_URL": "postgresql://u:p@h/base", **DB_ENV, "DB_DRIVER": "MYSQL"}
        )
        assert settings.url is not None
        assert settings.url.render_as_string(hide_password=False) == (
            "postgresql+psycopg://u:p@h/base"
        )

    @pytest.mark.parametrize(
        ("driver", "drivername"),
        [
            ("POSTGRES", "postgresql+psycopg"),
            ("MYSQL", "mysql+pymysql"),
            ("SINGLE_STORE", "singlestoredb"),
            ("postgres", "postgresql+psycopg"),
        ],
    )
    def test_db_variables_build_a_url_for_the_driver(self, driver: str, drivername: str) -> None:
        url = Settings.from_env({**DB_ENV, "DB_DRIVER": driver}).url
        assert url is not None
        assert url.drivername == drivername
        assert (url.host, url.port, url.database, url.username, url.password) == (
            "db.example",
            5433,
            "erp",
            "app",
            "p@ss:w/rd",
        )
        # the password survives a round trip through the URL text
        assert make_url(url.render_as_string(hide_password=False)).password == "p@ss:w/rd"

    def test_database_variables_are_aliases(self) -> None:
        url = Settings.from_env(
            {
                "DATABASE_HOST": "h2",
                "DATABASE_PORT": "3307",
                "DATABASE_NAME": "b2",
                "DATABASE_USER": "u2",
                "DATABASE_PASS": "p2",
                "DATABASE_DRIVER": "MYSQL",
            }
        ).url
        assert url is not None
        assert url.render_as_string(hide_password=False) == "mysql+pymysql://u2:p2@h2:3307/b2"

    def test_default_driver_is_postgresql(self) -> None:
        url = Settings.from_env(DB_ENV).url
        assert url is not None and url.drivername == "postgresql+psycopg"

    def test_password_is_hidden_in_repr(self) -> None:
        assert "p@ss" not in repr(Settings.from_env(DB_ENV))

    def test_bad_db_driver_names_the_variable_and_the_choices(self) -> None:
        with pytest.raises(ConfigurationError) as info:
            Settings.from_env({**DB_ENV, "DB_DRIVER": "ORACLE"})
        assert "DB_DRIVER" in str(info.value)
        assert "ORACLE" in str(info.value)
        assert "SINGLE_STORE" in str(info.value)

    def test_bad_db_port_names_the_variable(self) -> None:
        with pytest.raises(
            ConfigurationError, match="DB_PORT must be a whole number from 1 to 65535, not 'x'"
        ):
            Settings.from_env({**DB_ENV, "DB_PORT": "x"})

    @pytest.mark.parametrize(
        ("name", "value"), [("DATABASE_PORT", "x"), ("DATABASE_DRIVER", "oracle")]
    )
    def test_bad_database_alias_names_the_variable_that_was_set(
        self, name: str, value: str
    ) -> None:
        env = {"DATABASE_HOST": "h", "DATABASE_NAME": "b", name: value}
        with pytest.raises(ConfigurationError, match=name):
            Settings.from_env(env)

    @pytest.mark.parametrize(
        ("name", "value", "expected"),
        [
            ("QUEUE_MAX_RETRY", "1.5", f"QUEUE_MAX_RETRY {MAX_RETRY_RANGE}, not '1.5'"),
            ("QUEUE_MAX_RETRY", "many", f"QUEUE_MAX_RETRY {MAX_RETRY_RANGE}, not 'many'"),
            ("QUEUE_BASE_INTERVAL_RETRY", "five", "QUEUE_BASE_INTERVAL_RETRY must be a number"),
            ("QUEUE_WAIT_NOTIFY_INTERVAL", "soon", "QUEUE_WAIT_NOTIFY_INTERVAL must be a number"),
            ("QUEUE_WAIT_NOTIFY_INTERVAL", "-1", f"QUEUE_WAIT_NOTIFY_INTERVAL {SECONDS}, not '-1'"),
            ("SQLA_QUEUE_POLL_INTERVAL", "x", "SQLA_QUEUE_POLL_INTERVAL must be a number"),
        ],
    )
    def test_bad_number_names_the_variable(self, name: str, value: str, expected: str) -> None:
        with pytest.raises(ConfigurationError) as info:
            Settings.from_env({name: value})
        assert expected in str(info.value)

    @pytest.mark.parametrize(
        ("name", "value", "allowed"),
        [
            (name, value, allowed)
            for name, allowed, values in [
                (
                    "QUEUE_MAX_RETRY",
                    MAX_RETRY_RANGE,
                    ["nan", "inf", "0", "-3", "1000001", "9" * 30],
                ),
                (
                    "QUEUE_BASE_INTERVAL_RETRY",
                    MINUTES,
                    ["nan", "NaN", "inf", "-inf", "1e308", "1441"],
                ),
                (
                    "SQLA_QUEUE_POLL_INTERVAL",
                    SECONDS,
                    ["nan", "inf", "0", "-0.5", "86401", "1e400"],
                ),
                ("QUEUE_WAIT_NOTIFY_INTERVAL", SECONDS, ["nan", "Infinity", "0", "1e10"]),
                ("DB_PORT", "must be a whole number from 1 to 65535", ["0", "65536", "nan"]),
            ]
            for value in values
        ],
    )
    def test_absurd_number_is_refused_with_the_range(
        self, name: str, value: str, allowed: str
    ) -> None:
        with pytest.raises(ConfigurationError) as info:
            Settings.from_env({**DB_ENV, name: value})
        assert str(info.value) == f"{name} {allowed}, not {value!r}"

    @pytest.mark.parametrize(
        ("name", "value", "attribute", "expected"),
        [
            ("QUEUE_MAX_RETRY", "1", "max_retry", 1),
            ("QUEUE_MAX_RETRY", "1000000", "max_retry", 1_000_000),
            ("QUEUE_BASE_INTERVAL_RETRY", "0", "base_interval_retry_minutes", 0.0),
            ("QUEUE_BASE_INTERVAL_RETRY", "1440", "base_interval_retry_minutes", 1440.0),
            ("SQLA_QUEUE_POLL_INTERVAL", "0.001", "poll_interval_seconds", 0.001),
            ("QUEUE_WAIT_NOTIFY_INTERVAL", "86400", "listen_fallback_seconds", 86400.0),
        ],
    )
    def test_the_ends_of_each_range_are_accepted(
        self, name: str, value: str, attribute: str, expected: float
    ) -> None:
        assert getattr(Settings.from_env({name: value}), attribute) == expected

    def test_numbers_are_read(self) -> None:
        settings = Settings.from_env(
            {
                "QUEUE_MAX_RETRY": "7",
                "QUEUE_BASE_INTERVAL_RETRY": "2.5",
                "SQLA_QUEUE_POLL_INTERVAL": "0.25",
                "QUEUE_NAME": "fila",
                "QUEUE_TABLE": "public.fila",
                "LOG_DEBUG": "true",
            }
        )
        assert (
            settings.max_retry,
            settings.base_interval_retry_minutes,
            settings.poll_interval_seconds,
            settings.queue_name,
            settings.queue_table,
            settings.log_debug,
        ) == (7, 2.5, 0.25, "fila", "public.fila", True)

    def test_wait_notify_interval_is_read_from_its_own_name(self) -> None:
        assert (
            Settings.from_env({"QUEUE_WAIT_NOTIFY_INTERVAL": "12"}).listen_fallback_seconds == 12.0
        )

    def test_purge_limit_does_not_change_the_wait_notify_interval(self) -> None:
        # nsj-queue-lib read QUEUE_WAIT_NOTIFY_INTERVAL from QUEUE_PURGE_LIMIT
        settings = Settings.from_env({"QUEUE_PURGE_LIMIT": "1000"})
        assert settings.listen_fallback_seconds == 5.0
        both = Settings.from_env({"QUEUE_PURGE_LIMIT": "1000", "QUEUE_WAIT_NOTIFY_INTERVAL": "3"})
        assert both.listen_fallback_seconds == 3.0

    def test_sqlite_driver_needs_only_the_database_name(self) -> None:
        url = Settings.from_env({"DB_DRIVER": "SQLITE", "DB_BASE": "/tmp/fila.db"}).url
        assert url is not None
        assert url.render_as_string() == "sqlite:////tmp/fila.db"

    def test_no_url_without_host_or_base(self) -> None:
        assert Settings.from_env({"DB_HOST": "h"}).url is None
        assert Settings.from_env({"DB_BASE": "b"}).url is None

    def test_unparsable_url_raises_configuration_error(self) -> None:
        with pytest.raises(ConfigurationError, match="invalid database URL"):
            Settings.from_env({"SQLA_QUEUE_URL": "::not a url"})


# ------------------------------------------------------------------ retry
FAILED_AT = dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


class TestLinearBackoff:
    @pytest.mark.parametrize(("attempt", "minutes"), [(1, 5), (2, 10), (7, 35), (99, 495)])
    def test_attempt_n_retries_n_times_the_base_later(self, attempt: int, minutes: int) -> None:
        backoff = LinearBackoff(max_attempts=100, base_interval_minutes=5)
        assert backoff.next_attempt_at(attempt, FAILED_AT) == FAILED_AT + dt.timedelta(
            minutes=minutes
        )

    def test_fractional_base_interval(self) -> None:
        backoff = LinearBackoff(max_attempts=10, base_interval_minutes=0.5)
        assert backoff.next_attempt_at(3, FAILED_AT) == FAILED_AT + dt.timedelta(seconds=90)

    def test_zero_base_interval_retries_at_once(self) -> None:
        assert LinearBackoff(3, 0).next_attempt_at(2, FAILED_AT) == FAILED_AT

    @pytest.mark.parametrize("attempt", [3, 4])
    def test_no_next_attempt_at_the_maximum(self, attempt: int) -> None:
        assert LinearBackoff(max_attempts=3).next_attempt_at(attempt, FAILED_AT) is None

    def test_seed_defaults(self) -> None:
        backoff = LinearBackoff()
        assert (backoff.max_attempts, backoff.base_interval_minutes) == (100, 5.0)
        assert backoff.next_attempt_at(99, FAILED_AT) is not None
        assert backoff.next_attempt_at(100, FAILED_AT) is None

    def test_invalid_values_name_the_parameter(self) -> None:
        # a worker names its class attribute or variable (test_configuration.py);
        # a LinearBackoff built by hand names its own parameter
        with pytest.raises(ConfigurationError, match="LinearBackoff max_attempts must be"):
            LinearBackoff(max_attempts=0)
        with pytest.raises(ConfigurationError, match="LinearBackoff base_interval_minutes must"):
            LinearBackoff(base_interval_minutes=-1)
        with pytest.raises(ConfigurationError, match=r"base_interval_minutes must .*, not nan"):
            LinearBackoff(base_interval_minutes=float("nan"))


# ------------------------------------------------------------- TaskRecord
def _row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {column: None for column in SEED_COLUMNS}
    row.update(
        id=12,
        id_inicial=10,
        tentativa=3,
        status="processando",
        processo="faturar",
        chave_externa="7",
        payload='{"invoice": 7}',
        tenant=47,
        grupo_empresarial="G1",
        payload_hash=memoryview(b"ab" * 32),
        pub_sub=0,
        dead=1,
        prioridade=80,
        data_hora=FAILED_AT,
    )
    row.update(overrides)
    return row


class TestTaskRecord:
    def test_attribute_names_map_onto_every_seed_column(self) -> None:
        assert sorted(COLUMN_NAMES.values()) == sorted(TABLE_COLUMNS)
        assert len(COLUMN_NAMES) == 34

    def test_from_row_reads_seed_column_names(self) -> None:
        record = TaskRecord.from_row(_row())
        assert (
            record.id,
            record.initial_id,
            record.attempt,
            record.status,
            record.process,
            record.external_key,
            record.tenant,
            record.company_group,
            record.priority,
            record.run_at,
        ) == (12, 10, 3, "processando", "faturar", "7", 47, "G1", 80, FAILED_AT)
        assert record.payload_hash == b"ab" * 32
        assert type(record.payload_hash) is bytes
        assert record.pub_sub is False
        assert record.dead is True

    def test_item_access_by_seed_name(self) -> None:
        record = TaskRecord.from_row(_row())
        assert record["tentativa"] == 3
        assert record["id_inicial"] == 10
        assert record["grupo_empresarial"] == "G1"
        assert record["prioridade"] == 80
        # the seed's tarefa["payload"] is the stored text
        assert record["payload"] == '{"invoice": 7}'

    def test_unknown_seed_name_raises_key_error(self) -> None:
        record = TaskRecord.from_row(_row())
        with pytest.raises(KeyError, match="attempt"):
            record["attempt"]
        assert record.get("nao_existe", "default") == "default"

    def test_as_dict_is_the_seed_tarefa_dict(self) -> None:
        record = TaskRecord.from_row(_row())
        as_dict = record.as_dict()
        assert list(as_dict) == SEED_COLUMNS
        assert as_dict["tentativa"] == 3
        assert as_dict["payload"] == '{"invoice": 7}'
        assert as_dict["status"] == "processando"
        assert dict(record) == as_dict
        assert len(record) == 28

    def test_payload_is_decoded_json(self) -> None:
        assert TaskRecord.from_row(_row()).payload == {"invoice": 7}
        assert TaskRecord.from_row(_row(payload="texto livre")).payload == "texto livre"
        assert TaskRecord.from_row(_row(payload=None)).payload is None

    def test_chain_id_is_the_first_attempts_id(self) -> None:
        assert TaskRecord.from_row(_row()).chain_id == 10
        assert TaskRecord.from_row(_row(id_inicial=None)).chain_id == 12

    def test_missing_attempt_counts_as_the_first(self) -> None:
        assert TaskRecord.from_row(_row(tentativa=None)).attempt == 1

    def test_record_is_read_only(self) -> None:
        record = TaskRecord.from_row(_row())
        with pytest.raises(AttributeError):
            record.status = "sucesso"  # type: ignore[misc]


# ------------------------------------------------------------- BatchLimit
class TestBatchLimit:
    def test_starts_at_one(self) -> None:
        assert BatchLimit(100, 0.1).value == 1

    def test_doubles_while_full_batches_are_quick(self) -> None:
        limit = BatchLimit(100, 0.1)
        seen = []
        for _ in range(8):
            limit.record(limit.value, 0.0001 * limit.value)
            seen.append(limit.value)
        assert seen == [2, 4, 8, 16, 32, 64, 100, 100]

    def test_shrinks_to_what_fits_in_the_target(self) -> None:
        limit = BatchLimit(100, 1.0)
        limit.value = 64
        limit.record(64, 16.0)  # 0.25 s a task: four fit in one second
        assert limit.value == 4

    def test_the_nearest_number_of_tasks_fits(self) -> None:
        limit = BatchLimit(100, 0.1)
        limit.value = 2
        limit.record(2, 0.101)  # 50.5 ms a task: about two in 0.1 s
        assert limit.value == 2
        limit.record(2, 0.15)  # 75 ms a task: one
        assert limit.value == 1

    def test_slow_tasks_go_one_by_one(self) -> None:
        limit = BatchLimit(100, 0.1)
        limit.value = 8
        limit.record(8, 40.0)
        assert limit.value == 1

    def test_partial_batch_does_not_grow(self) -> None:
        limit = BatchLimit(100, 0.1)
        limit.value = 16
        limit.record(3, 0.0003)
        assert limit.value == 16

    def test_zero_seconds_grows_up_to_the_maximum(self) -> None:
        limit = BatchLimit(3, 0.1)
        limit.record(1, 0.0)
        limit.record(2, 0.0)
        assert limit.value == 3

    def test_maximum_one_stays_one(self) -> None:
        limit = BatchLimit(1, 0.1)
        limit.record(1, 0.0)
        assert limit.value == 1

    def test_maximum_below_one_is_refused(self) -> None:
        with pytest.raises(ConfigurationError, match="batch size must be at least 1, not 0"):
            BatchLimit(0, 0.1)
