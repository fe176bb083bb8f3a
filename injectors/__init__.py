"""Injectors: Kafka topics and log files as PySpark streaming sources with stable record ids."""

from __future__ import annotations

from typing import Any

from millstream.injectors.schema import INJECTED_SCHEMA
from millstream.injectors.sources import Source, kafka_source, logfile_source

__all__ = ["INJECTED_SCHEMA", "Source", "kafka_source", "logfile_source", "register"]


def register(spark: Any) -> None:
    """Make the `millstream-kafka` and `millstream-logfile` formats known to a SparkSession."""
    from millstream.injectors.kafka import KafkaInjector
    from millstream.injectors.logfile import LogFileInjector

    spark.dataSource.register(KafkaInjector)
    spark.dataSource.register(LogFileInjector)
