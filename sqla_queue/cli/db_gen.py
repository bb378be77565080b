"""``python -m sqla_queue.cli.db_gen SCHEMA QUEUE``: the seed's ``db_gen``.

nsj-queue-lib printed the PostgreSQL DDL of a queue table and its subscriber
table; this prints the same pair as ``sqla-queue ddl SCHEMA QUEUE
--subscribers`` (sqla-queue's table, which the reference's workers also use).
"""

from __future__ import annotations

import click

from .commands import print_ddl


@click.command()
@click.argument("schema")
@click.argument("queue")
def main(schema: str, queue: str) -> None:
    """Print the PostgreSQL DDL of queue SCHEMA.QUEUE and QUEUE_subscriber
    (sqla-queue ddl SCHEMA QUEUE --subscribers)."""
    print_ddl(schema, queue, subscribers=True)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="python -m sqla_queue.cli.db_gen")
