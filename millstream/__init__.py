"""millstream: exactly-once, MillWheel-style stream processing on Spark, Kafka and Redis.

The public API is what `__all__` lists; everything else is internal.
"""

from millstream.connectors.app import run
from millstream.connectors.combiners import Combiner, Count, Max, Mean, Min, Sum
from millstream.connectors.computation import Computation, Context
from millstream.connectors.formats import FormatError, ValueFormat, avro_format, json_format
from millstream.connectors.join_operator import JoinRetry
from millstream.connectors.topology import ComputationOptions, Topology, json_field, record_key
from millstream.connectors.windows import Hopping, Session, Tumbling
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
    "Combiner",
    "Computation",
    "ComputationOptions",
    "ConfigurationError",
    "Context",
    "Count",
    "FencedError",
    "FormatError",
    "Hopping",
    "JoinRetry",
    "Max",
    "Mean",
    "MillstreamError",
    "Min",
    "PoisonRecordError",
    "Production",
    "Record",
    "Session",
    "Settings",
    "Source",
    "Sum",
    "TimeDomain",
    "Timer",
    "TimestampContractError",
    "Topology",
    "TransientError",
    "Tumbling",
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
