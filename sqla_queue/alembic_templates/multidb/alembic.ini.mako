# Alembic configuration made by sqla-queue's multidb template
# (docs: https://github.com/sqla-queue/sqla-queue/blob/main/docs/migrations.md).

[alembic]
script_location = ${script_location}
# the current directory is put on sys.path, so target_metadata can be imported
prepend_sys_path = .
path_separator = os

# one section below for each database, in the order they migrate
databases = engine1, engine2

[engine1]
# the models' MetaData of this database, as module:attribute
target_metadata =
# its URL (alembic -x engine1_url=... overrides it)
sqlalchemy.url =

[engine2]
target_metadata =
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
