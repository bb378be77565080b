"""The SparkSession the jobs run in, and what it needs from the machine.

:func:`spark_session` builds (or returns the running) session with the
settings the jobs rely on, the same on a laptop and on a cluster except for
the master URL:

- the JDBC driver jars, found without Maven: Debian's
  ``libpostgresql-jdbc-java`` and ``libmariadb-java`` at their paths, or the
  paths given (``jars=``, ``--jdbc-jar``, ``SQLA_QUEUE_SPARK_JARS``). PySpark
  bundles no PostgreSQL or MariaDB driver. Called from Python without
  ``jars``, it adds the ones installed, as the commands do;
- the Python the executors run: this interpreter for a local master (its
  Python workers start ``python3`` from PATH otherwise, which cannot import
  sqla-queue); on a cluster, ``spark.pyspark.python`` or the
  ``PYSPARK_PYTHON`` of the executors' environment (docs/spark.md);
- UTC everywhere: the session time zone, and the JVM's, which the MariaDB
  driver uses to read ``DATETIME`` columns (naive UTC in a queue table);
- quiet logs (warnings only) and, for a local master, the loopback
  interface and few shuffle partitions.

A missing Java or jar is refused before the JVM starts, in one line that
names it and how to install it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..common.exceptions import SparkSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "JDBC_DRIVERS",
    "JdbcDriver",
    "find_java",
    "installed_jdbc_jars",
    "jdbc_jars",
    "spark_session",
]

DEFAULT_MASTER = "local[*]"
NO_PYSPARK = "PySpark is not installed: pip install 'sqla-queue[spark]'"
_LOCAL_CORES = re.compile(r"local\[(\d+)")
JARS_VARIABLE = "SQLA_QUEUE_SPARK_JARS"


class JdbcDriver:
    """Where Debian puts one database's JDBC driver, and its class name."""

    def __init__(self, database: str, jar: str, class_name: str, package: str) -> None:
        self.database = database
        self.jar = Path(jar)
        self.class_name = class_name
        self.package = package


#: by SQLAlchemy backend family (``dialect_family``)
JDBC_DRIVERS = {
    "postgresql": JdbcDriver(
        "PostgreSQL", "/usr/share/java/postgresql.jar", "org.postgresql.Driver",
        "libpostgresql-jdbc-java",
    ),
    "mysql": JdbcDriver(
        "MariaDB/MySQL", "/usr/share/java/mariadb-java-client.jar", "org.mariadb.jdbc.Driver",
        "libmariadb-java",
    ),
}  # fmt: skip


def find_java(env: Mapping[str, str] | None = None) -> str:
    """The ``java`` Spark will start: ``$JAVA_HOME/bin/java``, else PATH's."""
    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        java = Path(home, "bin", "java")
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        raise SparkSetupError(
            f"Java not found: JAVA_HOME={home} has no bin/java (install a Java 17+ runtime, "
            "Debian: apt-get install openjdk-17-jre-headless)"
        )
    java_path = shutil.which("java", path=env.get("PATH"))
    if java_path is None:
        raise SparkSetupError(
            "Java not found: Spark needs a Java 17+ runtime on PATH or in JAVA_HOME "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    return java_path


def jdbc_jars(
    families: Iterable[str], given: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> list[str]:
    """The jar paths for ``families``' drivers, checked to exist.

    ``given`` (or ``SQLA_QUEUE_SPARK_JARS``, paths separated by ``:`` or
    ``,``) replaces Debian's paths: each must exist; without it, Debian's jar
    of each family must."""
    env = os.environ if env is None else env
    paths = list(given) or [p for p in env.get(JARS_VARIABLE, "").replace(",", ":").split(":") if p]
    if paths:
        for path in paths:
            if not Path(path).is_file():
                raise SparkSetupError(f"JDBC driver jar not found: {path}")
        return paths
    jars = []
    for family in dict.fromkeys(families):
        driver = JDBC_DRIVERS.get(family)
        if driver is None:
            continue
        if not driver.jar.is_file():
            raise SparkSetupError(
                f"the {driver.database} JDBC driver jar is missing: {driver.jar} "
                f"(Debian: apt-get install {driver.package}; or give its path with "
                f"--jdbc-jar or {JARS_VARIABLE})"
            )
        jars.append(str(driver.jar))
    return jars


def installed_jdbc_jars(env: Mapping[str, str] | None = None) -> list[str]:
    """The jars :func:`spark_session` adds when it is given none:
    ``SQLA_QUEUE_SPARK_JARS``'s (each must exist), else Debian's jars of
    every database that are installed (a job on one database needs only
    its own; the other costs nothing)."""
    env = os.environ if env is None else env
    if env.get(JARS_VARIABLE):
        return jdbc_jars((), env=env)
    return [str(driver.jar) for driver in JDBC_DRIVERS.values() if driver.jar.is_file()]


def _local_cores(master: str) -> int:
    match = _LOCAL_CORES.match(master)
    return max(int(match.group(1)) if match else os.cpu_count() or 2, 1)


def _log_config() -> str:
    return str(resources.files("sqla_queue.spark").joinpath("log4j2.properties"))


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "sqla-queue",
    jars: Sequence[str] = (),
    config: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active SparkSession, or a new one on ``master`` (default
    ``local[*]``) with ``jars`` (default: :func:`installed_jdbc_jars`, as
    the commands find them) and the settings above; ``config`` adds or
    overrides Spark settings. An active session is returned as it is: its
    static settings (master, jars) were fixed when it started."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkSetupError(NO_PYSPARK) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    find_java()
    master = master or DEFAULT_MASTER
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # PySpark starts its Python workers with PYSPARK_PYTHON (default
        # python3 from PATH), not with spark.pyspark.python
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    java_options = f"-Duser.timezone=UTC -Dlog4j2.configurationFile=file:{_log_config()}"
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.ui.showConsoleProgress": "false",
        # the enqueue job's executors read Arrow batches of this many rows:
        # one database round trip (COPY or a batched INSERT) per batch
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    }
    if local:
        settings.update(
            {
                "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable,
                # one per core (Spark's default, 200, is for clusters)
                "spark.sql.shuffle.partitions": str(_local_cores(master)),
                "spark.ui.enabled": "false",
            }
        )
    jars = list(jars) or installed_jdbc_jars()
    if jars:
        settings["spark.jars"] = ",".join(jars)
    settings.update(config or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
