"""A task's payload as the dashboard shows it (``redact_json``): the values
of keys that name a secret masked whatever they hold, secrets inside other
strings masked as in ``mensagem``, everything else as it is."""

from __future__ import annotations

from sqla_queue.common.redaction import MASK, redact_json


def test_the_values_of_secret_keys_are_masked_at_any_depth() -> None:
    payload = {
        "password": "hunter2",
        "DB_PASSWORD": 42,
        "token": {"value": "t"},
        "X-Auth-Token": "t",
        "Authorization": "Basic abc",
        "items": [{"api_key": "k", "client_secret": None}],
        "user": "ana",
        "token_type": "bearer",
        "n": 1.5,
        "ok": True,
        "none": None,
    }
    assert redact_json(payload) == {
        "password": MASK,
        "DB_PASSWORD": MASK,
        "token": MASK,
        "X-Auth-Token": MASK,
        "Authorization": MASK,
        "items": [{"api_key": MASK, "client_secret": MASK}],
        "user": "ana",
        "token_type": "bearer",
        "n": 1.5,
        "ok": True,
        "none": None,
    }


def test_secrets_inside_strings_are_masked_as_in_messages() -> None:
    assert redact_json("password=abc and more") == f"password={MASK} and more"
    assert redact_json({"dsn": "mysql://u:p%40ss@h/db"}) == {"dsn": f"mysql://u:{MASK}@h/db"}
    assert redact_json(["Bearer abc.def", 3]) == [f"Bearer {MASK}", 3]
    assert redact_json(7) == 7 and redact_json(None) is None
