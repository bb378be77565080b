"""sqla-queue's alembic templates, one folder each (shipped in the wheel as
``sqla_queue.alembic_templates``; ``sqla-queue alembic init`` uses them)."""
