"""Alembic environment from sqla-queue's multidb template.

``databases`` in alembic.ini names one section per database, each with its
``sqlalchemy.url`` (or ``alembic -x NAME_url=...``) and its models'
``target_metadata`` (``module:attribute``). Every database migrates in its
own transaction; all commit at the end, or all roll back. Importing
``sqla_queue.alembic`` registers the queue operations and the comparator;
``include_object`` and ``render_item`` make a revision that serves every
database.
"""

import logging
import re
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from sqla_queue.alembic import include_object, load_metadata, migration_url, render_item

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)
logger = logging.getLogger("alembic.env")

x_arguments = context.get_x_argument(as_dictionary=True)
databases = {}
for name in re.split(r",\s*", config.get_main_option("databases", "").strip()):
    databases[name] = (
        migration_url(
            x_arguments.get(f"{name}_url"),
            config.get_section_option(name, "sqlalchemy.url"),
            environment=False,
        ),
        load_metadata(
            config.get_section_option(name, "target_metadata"),
            option=f"target_metadata of [{name}]",
        ),
    )


def run_migrations_offline() -> None:
    """Write each database's SQL to NAME.sql (alembic upgrade --sql)."""
    for name, (url, metadata) in databases.items():
        logger.info("Writing the SQL of database %s to %s.sql", name, name)
        with open(f"{name}.sql", "w") as buffer:
            context.configure(
                url=url,
                output_buffer=buffer,
                target_metadata=metadata,
                literal_binds=True,
                dialect_opts={"paramstyle": "named"},
            )
            with context.begin_transaction():
                context.run_migrations(engine_name=name)


def run_migrations_online() -> None:
    engines = {
        name: create_engine(url, poolclass=pool.NullPool) for name, (url, _) in databases.items()
    }
    connections = {name: engine.connect() for name, engine in engines.items()}
    transactions = {name: connection.begin() for name, connection in connections.items()}
    try:
        for name, (_, metadata) in databases.items():
            logger.info("Migrating database %s", name)
            context.configure(
                connection=connections[name],
                upgrade_token=f"{name}_upgrades",
                downgrade_token=f"{name}_downgrades",
                target_metadata=metadata,
                # autogenerate: the queue indexes compared by sqla-queue alone,
                # and server defaults that every database reads
                include_object=include_object,
                render_item=render_item,
            )
            context.run_migrations(engine_name=name)
        for transaction in transactions.values():
            transaction.commit()
    except BaseException:
        for transaction in transactions.values():
            transaction.rollback()
        raise
    finally:
        for connection in connections.values():
            connection.close()
        for engine in engines.values():
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
