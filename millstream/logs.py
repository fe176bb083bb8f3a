"""Logging for `millstream run`: millstream's own lines at MILLSTREAM_LOG_LEVEL, the libraries'.

py4j logs every call between Python and the JVM at INFO (`Received command c on object id p0`,
several a second), which buried millstream's own lines; Spark's JVM logs its start-up at WARN.
Both show only when MILLSTREAM_LOG_LEVEL=DEBUG asks for everything.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(message)s"
# Python loggers of libraries that speak for themselves at INFO.
CHATTY = ("py4j",)


def configure_logging(level: str) -> None:
    """Root at `level` (a no-op if the application configured logging first); libraries at
    WARNING unless `level` is DEBUG."""
    logging.basicConfig(level=level, format=FORMAT)
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def spark_log_level(level: str) -> str:
    """The JVM's log level for a MILLSTREAM_LOG_LEVEL: its errors only, unless DEBUG."""
    return "INFO" if level == "DEBUG" else "ERROR"


# Spark's JVM logs through log4j2; its defaults print WARN lines and a banner at start-up,
# before `setLogLevel` can run. This configuration prints its errors only. The root stays at WARN,
# the level Spark gives an interactive session such as PySpark's: any other, and Spark announces
# that it changed it.
_QUIET_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def spark_log_config(level: str) -> dict[str, str | int | float | bool | None]:
    """Spark configuration that quiets the JVM from its start (nothing at DEBUG: Spark's own
    defaults then apply)."""
    if level == "DEBUG":
        return {}
    path = Path(tempfile.gettempdir()) / f"millstream-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _QUIET_LOG4J2:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(_QUIET_LOG4J2)
        temporary.replace(path)  # atomic: a concurrent start never reads half a file
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={path}"}
