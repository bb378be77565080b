"""SingleStore's table options for sqla-queue's tables, added at compile time.

SingleStore creates columnstore tables by default, shards every table, and
requires each unique key (the primary key included) to contain the shard
key. A queue is many small updates of single rows by primary key, which is
what a *rowstore* table is for, so sqla-queue's queue and subscriber tables
are created ``ROWSTORE`` with ``SHARD KEY (id)``: their only unique key is
the primary key ``id``, which therefore contains the shard key, and a claim's
or a completion's update by id touches one partition.

The options are set when a ``CREATE TABLE`` is compiled for the
``singlestoredb`` dialect (sqlalchemy-singlestoredb renders them), not when
the model is declared: declaring them as ``singlestoredb_*`` table arguments
would import, or warn about, that dialect in every application, SingleStore
or not. Options the application set itself are kept.

Payloads stay ``LONGTEXT``, not SingleStore's ``JSON``: the seed's payloads
are any text (``"texto simples"`` is one), and ``JSON`` would refuse those
and normalise the others, changing the text that ``payload_hash`` hashes.
The subscriber table's ``headers`` column is ``JSON``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.compiler import DDLCompiler

#: Table.info keys that mark sqla-queue's tables (mixins.py, subscribers.py)
OWN_TABLES = ("sqla_queue", "sqla_queue_subscribers")
SHARD_KEY_COLUMNS = ("id",)


@compiles(CreateTable, "singlestoredb")
def _create_table(create: CreateTable, compiler: DDLCompiler, **kw: Any) -> str:
    table = create.element
    if any(table.info.get(key) for key in OWN_TABLES):
        from sqlalchemy_singlestoredb import RowStore, ShardKey

        options = table.dialect_options["singlestoredb"]
        if options.get("table_type") is None:
            options["table_type"] = RowStore()
        if options.get("shard_key") is None:
            options["shard_key"] = ShardKey(*SHARD_KEY_COLUMNS)
    return compiler.visit_create_table(create, **kw)  # type: ignore[no-untyped-call,no-any-return]
