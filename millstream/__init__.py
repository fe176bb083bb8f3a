"""millstream: exactly-once, MillWheel-style stream processing on Spark, Kafka and Redis.

The public API is what `__all__` lists; everything else is internal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time each is imported on first use
    from millstream.connectors.app import run
    from millstream.connectors.combiners import Combiner, Count, Max, Mean, Min, Sum
    from millstream.connectors.computation import Computation, Context
    from millstream.connectors.formats import FormatError, ValueFormat, avro_format, json_format
    from millstream.connectors.join_log import JoinLog
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
    "JoinLog",
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

# Where each public name lives. `import millstream` itself imports none of them: every Python
# worker Spark starts imports this package (it unpickles the injectors and shard tasks from it),
# and importing all of it took about a second there, once per worker and pipeline start.
_EXPORTS: dict[str, str] = {
    "avro_format": "millstream.connectors.formats",
    "Combiner": "millstream.connectors.combiners",
    "Computation": "millstream.connectors.computation",
    "ComputationOptions": "millstream.connectors.topology",
    "ConfigurationError": "millstream.errors",
    "Context": "millstream.connectors.computation",
    "Count": "millstream.connectors.combiners",
    "FencedError": "millstream.errors",
    "FormatError": "millstream.connectors.formats",
    "Hopping": "millstream.connectors.windows",
    "JoinLog": "millstream.connectors.join_log",
    "JoinRetry": "millstream.connectors.join_operator",
    "json_field": "millstream.connectors.topology",
    "json_format": "millstream.connectors.formats",
    "kafka_source": "millstream.injectors.sources",
    "logfile_source": "millstream.injectors.sources",
    "Max": "millstream.connectors.combiners",
    "Mean": "millstream.connectors.combiners",
    "MillstreamError": "millstream.errors",
    "Min": "millstream.connectors.combiners",
    "PoisonRecordError": "millstream.errors",
    "Production": "millstream.records",
    "Record": "millstream.records",
    "record_key": "millstream.connectors.topology",
    "run": "millstream.connectors.app",
    "Session": "millstream.connectors.windows",
    "Settings": "millstream.settings",
    "Source": "millstream.injectors.sources",
    "Sum": "millstream.connectors.combiners",
    "TimeDomain": "millstream.records",
    "Timer": "millstream.records",
    "TimestampContractError": "millstream.errors",
    "Topology": "millstream.connectors.topology",
    "TransientError": "millstream.errors",
    "Tumbling": "millstream.connectors.windows",
    "ValueFormat": "millstream.connectors.formats",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'millstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
