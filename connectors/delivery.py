"""Step 5 of the shard protocol: deliver checkpointed productions to their streams' targets.

Sinks are built once per Python worker process and reused across batches and shards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from millstream.connectors.plan import BatchPlan
from millstream.errors import MillstreamError
from millstream.fault_points import fault_point
from millstream.records import Production
from millstream.state.client import REDIS_ERRORS, connect
from millstream.state.watermarks import Watermark, WatermarkAuthority

if TYPE_CHECKING:
    from millstream.connectors.stage_plan import Stage

log = logging.getLogger(__name__)
# What a failed delivery raises that the next batch retries: its checkpoints stay in place.
# (ConfigurationError, a MillstreamError, is caught before these and raised: no retry helps.)
RETRIED: tuple[type[Exception], ...] = (MillstreamError, KafkaException, *REDIS_ERRORS)

_SINKS: dict[tuple[str, str, str, int], Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Target:
    """How to build the sink of one stream on an executor; `index` orders several targets."""

    factory: Callable[[], Any]
    index: int = 0


def _sink(plan: BatchPlan, computation: str, stream: str, target: Target) -> Any:
    return _built(plan.app, computation, stream, target)


def _built(app: str, computation: str, stream: str, target: Target) -> Any:
    cache_key = (app, computation, stream, target.index)
    with _LOCK:
        sink = _SINKS.get(cache_key)
    if sink is None:
        sink = target.factory()
        sink.setup()
        with _LOCK:
            sink = _SINKS.setdefault(cache_key, sink)
    return sink


def warm_sinks(app: str, stages: Iterable[Stage]) -> None:
    """Build and set up every target's sink of these stages in this process ahead of its first
    delivery. A Kafka producer's first record waits about 0.5 s for its producer id; built at
    start, the first batch's productions (a first dead letter) do not. A failure here is left
    to the first delivery, which raises it where it is handled."""
    for stage in stages:
        for stream, targets in stage.targets.items():
            for target in targets:
                try:
                    _built(app, stage.name, stream, target)
                except Exception as exc:
                    log.debug("sink of %s/%s not built ahead: %s", stage.name, stream, exc)


def release_sinks(app: str) -> None:
    """Close and forget the sinks `app` built in this process, once it stopped: a process that
    runs applications one after another (tests, notebooks, the bench) kept every one's Kafka
    producers and clients. A later run of `app` here builds them again."""
    with _LOCK:
        keys = [k for k in _SINKS if k[0] == app]
        sinks = [_SINKS.pop(k) for k in keys]
    for sink in sinks:
        close = getattr(sink, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception as exc:  # a stopped application's sink: nothing waits on it
            log.warning("closing a sink of stopped application %s: %s", app, exc)


def deliver_all(
    plan: BatchPlan, computation: str, shard: int, productions: list[Production]
) -> list[Production]:
    """Deliver every production to every target of its stream; return them once all acked.

    Raises (leaving the checkpoints in place, so the next owner re-delivers) when a target fails.
    """
    from millstream.sinks.base import ShardRef

    ref = ShardRef(plan.app, computation, shard)
    by_stream: dict[str, list[Production]] = {}
    for production in sorted(productions, key=lambda p: p.seq):
        by_stream.setdefault(production.stream, []).append(production)
    delivered: list[Production] = []
    for stream, items in by_stream.items():
        targets = plan.deliveries.get(stream, ())
        for target in targets:
            fault_point("after_redis_commit")  # a no-op unless a test installed a hook
            report = _sink(plan, computation, stream, target).deliver(ref, items)
            fault_point("after_kafka_commit")
            if stream in plan.in_flight_streams and target.index == 0:
                _record_in_flight(plan, stream, report)
        delivered.extend(items)
    return delivered


def _record_in_flight(plan: BatchPlan, stream: str, report: Any) -> None:
    """Delivered records wait in the topic: they hold the consumers' watermark until read."""
    entries = [
        (partition, max_offset, Watermark(min_event, min_system))
        for (_topic, partition), (max_offset, min_event, min_system) in report.partitions.items()
    ]
    if entries:
        authority = WatermarkAuthority(connect(plan.redis_url), plan.app)
        authority.add_in_flight(stream, entries, token=f"{plan.batch_id}")
