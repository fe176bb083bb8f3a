"""Injectors: Kafka topics and log files as PySpark streaming sources with stable record ids."""

from __future__ import annotations

import logging
from typing import Any

from millstream.injectors.schema import INJECTED_SCHEMA
from millstream.injectors.sources import Source, kafka_source, logfile_source

__all__ = ["INJECTED_SCHEMA", "Source", "kafka_source", "logfile_source", "register"]

log = logging.getLogger(__name__)


def register(spark: Any) -> None:
    """Make the `millstream-kafka` and `millstream-logfile` formats known to a SparkSession."""
    from millstream.injectors.kafka import KafkaInjector
    from millstream.injectors.logfile import LogFileInjector

    _skip_static_source_lookup(spark)
    spark.dataSource.register(KafkaInjector)
    spark.dataSource.register(LogFileInjector)


def _skip_static_source_lookup(spark: Any) -> bool:
    """Spare the JVM its scan of the Python path for `pyspark_*` data-source packages.

    Spark runs that scan in a Python worker the first time a Python data source is named, and
    it cost 2.3-2.9 s of every pipeline start on a 2-core machine (register: 2.5 s with it,
    0.3 s without). A pipeline's session only reads the formats registered here, so the scan
    finds nothing it uses. The static registry is Spark-internal (`DataSourceManager`): if it
    is not where this Spark keeps it, the scan simply runs as before (and this returns False).
    """
    try:
        jvm = spark.sparkContext._jvm
        package = jvm.org.apache.spark.sql.execution.datasources
        manager = getattr(package, "DataSourceManager$").__getattr__("MODULE$")
        if manager.dataSourceBuilders().isEmpty():  # not scanned yet in this JVM
            empty = jvm.scala.Predef.Map().empty()
            getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Some(empty))
        return True
    except Exception as exc:  # an optimisation only: Spark then scans as usual
        log.debug("Python data-source scan left to Spark (%s)", exc)
        return False
