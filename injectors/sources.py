"""Declaring injectors in a topology: which Spark data source feeds a stream, with what options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KAFKA_FORMAT = "millstream-kafka"
LOGFILE_FORMAT = "millstream-logfile"


@dataclass(frozen=True)
class Source:
    """An injector feeding a stream: a Spark data source format plus its options.

    Built by `kafka_source` / `logfile_source` (or by hand for another registered format) and
    given to `Topology.source`; the runtime reads the stream with `spark.readStream.format()`.
    """

    name: str
    format: str
    options: Mapping[str, str]


def _options(options: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in options.items() if v is not None}


def kafka_source(
    topic: str,
    *,
    name: str = "kafka",
    id_header: str | None = None,
    id_extractor: str | None = None,
    timestamp_extractor: str | None = None,
    starting_offsets: str = "earliest",
    **options: Any,
) -> Source:
    """A Kafka topic of the user's cluster (KAFKA_BOOTSTRAP_SERVERS unless `bootstrap.servers`).

    Extractors are "module:function" paths, imported on the executors.
    """
    return Source(
        name,
        KAFKA_FORMAT,
        _options(
            {
                "topics": topic,
                "idHeader": id_header,
                "idExtractor": id_extractor,
                "timestampExtractor": timestamp_extractor,
                "startingOffsets": starting_offsets,
                **options,
            }
        ),
    )


def logfile_source(
    path: str, *, name: str = "logs", pattern: str = "*.log", **options: Any
) -> Source:
    """A directory of append-only log files (JSON lines by default)."""
    return Source(name, LOGFILE_FORMAT, _options({"path": path, "pattern": pattern, **options}))
