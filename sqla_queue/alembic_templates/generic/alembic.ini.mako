# Alembic configuration made by sqla-queue's generic template
# (docs: https://github.com/sqla-queue/sqla-queue/blob/main/docs/migrations.md).

[alembic]
script_location = ${script_location}
# the current directory is put on sys.path, so target_metadata can be imported
prepend_sys_path = .
path_separator = os

# your models' MetaData, as module:attribute (a declarative base will do),
# e.g. myapp.models:Base.metadata
target_metadata =

# The database: alembic -x url=..., else SQLA_QUEUE_URL or the DB_* variables
# (what the workers read), else this.
sqlalchemy.url =

[post_write_hooks]

[loggers]
keys = root,sqlalchemy,alembic

[handlers]
keys = console

[formatters]
keys = generic

[logger_root]
level = WARNING
handlers = console
qualname =

[logger_sqlalchemy]
level = WARNING
handlers =
qualname = sqlalchemy.engine

[logger_alembic]
level = INFO
handlers =
qualname = alembic

[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic

[formatter_generic]
format = %(levelname)-5.5s [%(name)s] %(message)s
datefmt = %H:%M:%S
