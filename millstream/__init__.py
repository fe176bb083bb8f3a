"""millstream: exactly-once, MillWheel-style stream processing on Spark, Kafka and Redis.

The public API is what `__all__` lists; everything else is internal.
"""

from millstream.connectors.app import run
from millstream.connectors.computation import Computation, Context
from millstream.connectors.formats import FormatError, ValueFormat, avro_format, json_format
from millstream.connectors.topology import ComputationOptions, Topology, json_field, record_key
from millstream.errors import (
    ConfigurationError,
    FencedError,
    MillstreamError,
    PoisonRecordError,
    TimestampContractError,
    TransientError,
)
from millstream.injectors.sources import Source, kafka_source, logfile_source
from millstream.records import Production, Record, TimeDomain, Timer
from millstream.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "Computation",
    "ComputationOptions",
    "ConfigurationError",
    "Context",
    "FencedError",
    "FormatError",
    "MillstreamError",
    "PoisonRecordError",
    "Production",
    "Record",
    "Settings",
    "Source",
    "TimeDomain",
    "Timer",
    "TimestampContractError",
    "Topology",
    "TransientError",
    "ValueFormat",
    "__version__",
    "avro_format",
    "json_field",
    "json_format",
    "kafka_source",
    "logfile_source",
    "record_key",
    "run",
]
