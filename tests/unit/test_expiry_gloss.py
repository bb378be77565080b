"""The TTL routine's stored text (Portuguese, as the seed's) has an English
gloss for people, whatever its minutes, as every other fixed text does."""

from __future__ import annotations

from sqla_queue.maintenance.ttl import TtlConfig
from sqla_queue.ops.status import message_gloss


def test_the_ttl_routines_messages_are_glossed_in_english() -> None:
    live, dead = TtlConfig(ttl_minutes=2.5).message(False), TtlConfig(ttl_minutes=90).message(True)
    assert live.startswith("Tarefa expirada: pendente há mais de 2.5 minutos")  # stored as is
    assert message_gloss(live) == (
        "expired: ready for more than 2.5 minutes (item_ttl); sent to the dead letter"
    )
    assert message_gloss(dead) == (
        "expired: ready for more than 90 minutes (item_ttl); a dead-letter run: none follows"
    )
    assert message_gloss("Tarefa expirada: pendente há mais de 5 minutos (item_ttl). extra") is None
    assert message_gloss("my handler's own text") is None
