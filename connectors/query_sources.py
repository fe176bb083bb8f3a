"""What a fused query reads: its injectors' options, and the topics of streams that
computations of other queries produce, as the `(format, options)` of each Spark source."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from millstream.connectors.driver_read import local_folder
from millstream.connectors.stage_plan import Stage
from millstream.connectors.targets import Endpoints
from millstream.connectors.topology import Topology
from millstream.settings import Settings

log = logging.getLogger(__name__)
PAUSABLE = ("millstream-kafka", "millstream-logfile")  # sources that read the throttle flag
# Admission budget of a stream other inputs wait on (a join's queries), in batches' worth: a
# backlog of queries is read ahead of its clicks instead of beside them (benchmarks/results/
# join-read-ahead: 100,000 pre-loaded clicks, a third fewer look-ups and 1.28x the clicks/s).
READ_AHEAD = 2


def kafka_options(settings: Settings, endpoints: Endpoints) -> dict[str, str]:
    """A Kafka source's connection (every extra librdkafka setting as `kafka.<name>`)."""
    kafka = dict(endpoints.kafka)
    options = {
        "bootstrap.servers": kafka.pop("bootstrap.servers"),
        "maxFutureMs": str(settings.max_future_ms),
    }
    options.update({f"kafka.{key}": value for key, value in kafka.items()})
    return options


def tick_options(settings: Settings) -> dict[str, str]:
    """The clock tick that gives timers batches, and the admission control per batch."""
    return {
        "tickMs": str(max(100, settings.trigger_ms)),
        "maxRecordsPerTrigger": str(settings.max_records_per_batch),
    }


def start_file(checkpoint: str, source: str) -> str | None:
    """Where a Kafka source of the query keeps its first start positions: in the query's
    checkpoint folder, when that is on the local disk (the source runs beside the driver)."""
    folder = local_folder(checkpoint)
    if folder is None:
        return None
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return os.path.join(folder, "millstream-starts", f"{digest}.json")


def source_options(
    topology: Topology,
    settings: Settings,
    endpoints: Endpoints,
    stages: Mapping[str, Stage],
    injected: Sequence[str],
    topic_inputs: Sequence[str],
    instance: Callable[[str], str],
    checkpoint: str,
) -> list[tuple[str, dict[str, str]]]:
    """Each source, in the order the query unions them: every injector of the `injected`
    streams (its instance named by `instance(source name)`: each query reads from its own
    positions), then the topic of each of `topic_inputs`."""
    # A join's primary stream, paused while its joiner has too many waiting clicks.
    throttled = {
        s
        for spec in topology.computations.values()
        if (throttle := spec.operator.throttle()) is not None
        for s in throttle.streams
    }
    ahead = {s for spec in topology.computations.values() for s in spec.operator.read_ahead()}
    sources: list[tuple[str, dict[str, str]]] = []
    for stream in injected:
        for src in topology.sources[stream]:
            options = dict(src.options)
            if src.format == "millstream-kafka":
                options.update(kafka_options(settings, endpoints))
                kept = start_file(checkpoint, f"{instance(src.name)}|{options.get('topics')}")
                if kept is not None:
                    options["startFile"] = kept
            options.update(tick_options(settings))
            if stream in ahead:
                budget = READ_AHEAD * settings.max_records_per_batch
                options["maxRecordsPerTrigger"] = str(budget)
            options.update(
                {
                    "stream": stream,
                    "instance": instance(src.name),
                    "app": topology.app,
                    "redis.url": endpoints.redis_url,
                    "idleSlackMs": str(settings.idle_slack_ms),
                    "outageGraceMs": str(settings.outage_grace_ms),
                }
            )
            if stream in throttled and src.format in PAUSABLE:
                options["throttle"] = "true"
            elif stream in throttled:
                log.warning(
                    "stream %s: a join's max_waiting cannot pause its %s source (only Kafka "
                    "and log-file sources pause); its waiting clicks are not bounded", stream,
                    src.format,
                )  # fmt: skip
            sources.append((src.format, options))
    for stream in topic_inputs:
        start = next(
            (s.spec.options.start for s in stages.values() if stream in s.topic_inputs),
            "latest",
        )
        options = {
            **kafka_options(settings, endpoints),
            **tick_options(settings),
            "stream": stream,
            "topics": topology.topic_of(stream),
            "startingOffsets": start,
            "idHeader": "ms-id",
        }
        kept = start_file(checkpoint, f"{stream}|{options['topics']}")
        if kept is not None:
            options["startFile"] = kept

        sources.append(("millstream-kafka", options))
    return sources
