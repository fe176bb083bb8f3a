"""The driver side of DESIGN.md section 2: one Structured Streaming query per computation.

Each micro-batch: read the input low watermark, route rows to shards (one task per shard, empty
shards included so their timers fire), collect shard results, then publish the computation's
low watermark (monotonic) and its metrics.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from millstream.connectors.backpressure import hold_while_backlogged
from millstream.connectors.delivery import Target
from millstream.connectors.driver_delivery import DriverDelivery
from millstream.connectors.formats import FieldExtractor, FormatError, ValueFormat, decode_with
from millstream.connectors.plan import BatchPlan, TaskInput, shard_of
from millstream.connectors.shard_task import (
    ERROR,
    ID,
    KEY,
    STREAM,
    VALUE,
    ShardResult,
    format_error,
    run_shard,
)
from millstream.connectors.topology import DEAD_LETTERS, ComputationSpec, Topology
from millstream.errors import MillstreamError
from millstream.kafka_admin import check_topics
from millstream.settings import Settings, mask_url
from millstream.state.client import connect
from millstream.state.keys import ShardKeys, app_key
from millstream.state.shard import ShardConfig, oldest_work
from millstream.state.shard_count import record_shard_count
from millstream.state.watermarks import (
    INFINITY,
    NONE_KNOWN,
    Watermark,
    WatermarkAuthority,
    merge_min,
    now_ms,
    percentile_watermark,
)
from millstream.status import record_batch_seconds

log = logging.getLogger(__name__)
DEFAULT_PARTITIONS = 4  # for internal topics created here; existing ones keep their own count
TOPIC_TIMEOUT_S = 30.0  # a metadata request at start-up
OOM_RETRY_SECONDS = 600  # how long a batch waits for Redis to accept writes again


@dataclass(frozen=True)
class Endpoints:
    """Where Redis and Kafka are, once embedded services (if any) are up."""

    redis_url: str
    kafka: dict[str, str]  # librdkafka config: bootstrap.servers plus pass-through settings


@dataclass(frozen=True)
class InternalStreamSink:
    """Factory for the idempotent producer that writes an internal stream's topic."""

    topic: str
    kafka: tuple[tuple[str, str], ...]

    def __call__(self) -> Any:
        from millstream.sinks.kafka_stream import KafkaStreamSink

        return KafkaStreamSink(dict(self.kafka), topic_for=lambda _stream: self.topic)


@dataclass(frozen=True)
class UserSink:
    sink: Any

    @classmethod
    def bound(cls, sink: Any, kafka: dict[str, str]) -> UserSink:
        """The user's sink bound on the driver to the application's Kafka settings: a sink
        declared without any (`KafkaTransactionalSink(topic=...)`) delivers to this cluster."""
        from millstream.sinks.base import bind_sink

        return cls(bind_sink(sink, kafka))

    def __call__(self) -> Any:
        return self.sink


def _route(
    extractors: dict[str, Any],
    shards: int,
    rows: Iterator[Any],
    formats: Mapping[str, ValueFormat] | None = None,
) -> Iterator[tuple[int, TaskInput]]:
    """Map side: extract each row's key with its stream's extractor; errors travel with the row.

    A stream with a value format (`formats`) has its value decoded here, once: the data
    travels with the row to the shard task, and a field extractor of the same format reads
    it instead of decoding again. A value that does not decode is an error row.
    """
    for row in rows:
        values = tuple(row)
        if values[ERROR] is not None:
            yield shard_of(values[ID].hex(), shards), TaskInput(None, values, values[ERROR])
            continue
        value = values[VALUE] or b""
        fmt = formats.get(values[STREAM]) if formats else None
        data: Any = None
        extract = extractors[values[STREAM]]
        try:
            if fmt is not None:
                data = decode_with(fmt, value)
            if fmt is not None and isinstance(extract, FieldExtractor) and extract.format == fmt:
                key = extract.from_data(data)
            else:
                key = extract(values[KEY], value)
            if not isinstance(key, str):
                raise TypeError(f"key extractor returned {type(key).__name__}, expected str")
        except FormatError as exc:
            reason = format_error(values, exc)
            yield shard_of(values[ID].hex(), shards), TaskInput(None, values, reason)
        except Exception as exc:
            reason = f"key extraction failed: {type(exc).__name__}: {exc}"
            yield shard_of(values[ID].hex(), shards), TaskInput(None, values, reason)
        else:
            item = TaskInput(key, values, None, data, decoded=fmt is not None)
            yield shard_of(key, shards), item


def redis_out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write at maxmemory: raised here, or in a Spark task (then only the
    text of the worker's traceback reaches the driver)."""
    text = str(exc)  # Redis says "OOM command not allowed when used memory > 'maxmemory'"
    return isinstance(exc, redis.OutOfMemoryError) or "command not allowed when used memory" in text


def _shard_task(
    plan: BatchPlan, spec: ComputationSpec, index: int, items: Iterator[tuple[int, TaskInput]]
) -> Iterator[ShardResult]:
    yield run_shard(plan, spec, index, [item for _, item in items])


class ComputationRunner:
    """Owns one computation's streaming query and its per-batch protocol."""

    def __init__(
        self, topology: Topology, spec: ComputationSpec, settings: Settings, endpoints: Endpoints
    ) -> None:
        self.topology = topology
        self.spec = spec
        self.settings = settings
        self.endpoints = endpoints
        self.shards = spec.options.shards or settings.shards
        self.client = connect(endpoints.redis_url)
        # Before anything else: another count than the recorded one would strand state.
        record_shard_count(self.client, topology.app, spec.name, self.shards)
        self.authority = WatermarkAuthority(self.client, topology.app)
        self.metrics_key = app_key(topology.app, "metrics", spec.name)
        self.query: Any = None
        self.internal_inputs = frozenset(s for s in spec.inputs if s not in topology.sources)
        self.input_partitions = self._input_partitions()
        self.shard_config = ShardConfig(
            bucket_ms=settings.bucket_seconds * 1000,
            bloom_expected=settings.bloom_expected,
            bloom_fp_rate=settings.bloom_fp_rate,
            use_bloom=spec.options.use_bloom,
        )
        self.deliveries = self._deliveries()
        self.driver_delivery = (
            DriverDelivery(spec.name, self.shards, self.client)
            if self._delivers_from_driver()
            else None
        )
        self.last_batch: dict[str, Any] = {}

    # --- wiring ------------------------------------------------------------------------------
    def _input_partitions(self) -> dict[str, int]:
        """Partition count of each internal input's topic, from the broker's metadata.

        Not the topology's configured count: a topic created beforehand may have more, and
        in-flight records in partitions the watermark does not look at would not hold it.
        Read once: partition counts do not change under a running computation (adding
        partitions would also move keys between them, which nothing here supports).
        """
        streams = sorted(self.internal_inputs)
        if not streams:
            return {}
        counts = check_topics(
            self.endpoints.kafka, [self.topology.topic_of(s) for s in streams], TOPIC_TIMEOUT_S
        )
        return {s: counts[self.topology.topic_of(s)] for s in streams}

    def _deliveries(self) -> dict[str, tuple[Target, ...]]:
        kafka = tuple(sorted(self.endpoints.kafka.items()))
        out: dict[str, tuple[Target, ...]] = {}
        for stream in self.spec.outputs:
            targets: list[Target] = []
            consumed = bool(self.topology.consumers_of(stream))
            if consumed or stream not in self.topology.sinks or stream == DEAD_LETTERS:
                targets.append(Target(InternalStreamSink(self.topology.topic_of(stream), kafka), 0))
            if stream in self.topology.sinks:
                sink = UserSink.bound(self.topology.sinks[stream], self.endpoints.kafka)
                targets.append(Target(sink, len(targets)))
            out[stream] = tuple(targets)
        return out

    def _delivers_from_driver(self) -> bool:
        """`delivery="auto"`: the driver when some target keeps a producer per shard (measured:
        1.14x the throughput into a transactional sink); else the shard tasks, whose deliveries
        overlap each other and spread over executors."""
        if self.spec.options.delivery != "auto":
            return self.spec.options.delivery == "driver"
        return any(
            getattr(getattr(target.factory, "sink", None), "keeps_shard_producers", False)
            for targets in self.deliveries.values()
            for target in targets
        )

    def input_frame(self, spark: Any) -> Any:
        """Union of this computation's input streams, each read by its injector(s)."""
        app, name = self.topology.app, self.spec.name
        frames = []
        for stream in self.spec.inputs:
            if stream in self.topology.sources:
                for src in self.topology.sources[stream]:
                    reader = spark.readStream.format(src.format).options(**src.options)
                    if src.format == "millstream-kafka":
                        reader = self._kafka_options(reader, has_topic=True)
                    frames.append(
                        reader.option("stream", stream)
                        .option("instance", f"{src.name}@{name}")
                        .option("app", app)
                        .option("redis.url", self.endpoints.redis_url)
                        .option("tickMs", str(max(100, self.settings.trigger_ms)))
                        .option("idleSlackMs", str(self.settings.idle_slack_ms))
                        .option("outageGraceMs", str(self.settings.outage_grace_ms))
                        .option("maxRecordsPerTrigger", str(self.settings.max_records_per_batch))
                        .load()
                    )
            else:
                reader = spark.readStream.format("millstream-kafka")
                frames.append(
                    self._kafka_options(reader, has_topic=False)
                    .option("topics", self.topology.topic_of(stream))
                    .option("stream", stream)
                    .option("startingOffsets", self.spec.options.start)
                    .option("idHeader", "ms-id")
                    .option("tickMs", str(max(100, self.settings.trigger_ms)))
                    .option("maxRecordsPerTrigger", str(self.settings.max_records_per_batch))
                    .load()
                )
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _kafka_options(self, reader: Any, *, has_topic: bool) -> Any:
        kafka = dict(self.endpoints.kafka)
        reader = reader.option("bootstrap.servers", kafka.pop("bootstrap.servers"))
        reader = reader.option("maxFutureMs", str(self.settings.max_future_ms))
        for key, value in kafka.items():
            reader = reader.option(f"kafka.{key}", value)
        return reader

    def start(self, spark: Any) -> Any:
        checkpoint = f"{self.settings.checkpoint_dir}/{self.topology.app}/{self.spec.name}"
        self.query = (
            self.input_frame(spark)
            .writeStream.queryName(f"{self.topology.app}.{self.spec.name}")
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{self.settings.trigger_ms} milliseconds")
            .start()
        )
        return self.query

    # --- the per-batch protocol ------------------------------------------------------------
    def _consumed_key(self, stream: str) -> str:
        return app_key(self.topology.app, "consumed", self.spec.name, stream)

    def _consumed(self, stream: str) -> dict[int, int]:
        raw = self.client.hgetall(self._consumed_key(stream))
        return {int(k): int(v) for k, v in raw.items()}

    def _retire_in_flight(self, streams: list[str]) -> None:
        """Drop in-flight entries that every consumer of the stream has read past (DESIGN.md 6).

        Pure garbage collection: `in_flight` only reads entries at or beyond a consumer's
        committed offset, so entries below every consumer's offset never count again. A
        partition some consumer has not read yet keeps all its entries.
        """
        for stream in streams:
            floor: dict[int, int] | None = None
            for consumer in self.topology.consumers_of(stream):
                raw = self.client.hgetall(app_key(self.topology.app, "consumed", consumer, stream))
                offsets = {int(p): int(o) for p, o in raw.items()}
                floor = (
                    offsets
                    if floor is None
                    else {p: min(o, offsets[p]) for p, o in floor.items() if p in offsets}
                )
            if floor:
                self.authority.retire_in_flight(stream, floor)

    def input_watermark(self) -> Watermark:
        """min over input streams: injector estimates, or producers' watermarks and in-flight."""
        parts: list[Watermark] = []
        for stream in self.spec.inputs:
            if stream in self.topology.sources:
                instances = [f"{s.name}@{self.spec.name}" for s in self.topology.sources[stream]]
                estimate = self.authority.injector_watermark(stream, instances)
                bound = self.topology.out_of_order_ms.get(stream, 0)
                if estimate.event > NONE_KNOWN.event:
                    estimate = Watermark(estimate.event - bound, estimate.system)
                parts.append(estimate)
                continue
            for producer in self.topology.producer_of(stream):
                parts.append(self.authority.published(producer) or NONE_KNOWN)
            partitions = self.input_partitions[stream]
            parts.append(self.authority.in_flight(stream, partitions, self._consumed(stream)))
        return self.authority.publish(f"{self.spec.name}#input", merge_min(parts))

    def process_batch(self, batch_df: Any, batch_id: int) -> None:
        """Run one micro-batch; while Redis is at maxmemory, say so and run it again.

        Redis refusing writes (OOM under `maxmemory-policy noeviction`) is not a reason to stop
        the pipeline: a refused commit writes nothing, the exactly-once protocol makes a re-run
        of the batch safe (shards that did commit see their records as replays), and an
        operator can fix it at run time. Any other failure fails the query as before; so does an OOM that
        lasts longer than OOM_RETRY_SECONDS.
        """
        # Backpressure: while a shard's productions pile up undelivered, take no new input.
        hold_while_backlogged(self, batch_df.sparkSession, batch_id)
        deadline = time.monotonic() + OOM_RETRY_SECONDS
        delay = 1.0
        while True:
            try:
                self._process_batch_once(batch_df, batch_id)
                return
            except Exception as exc:
                if not redis_out_of_memory(exc):
                    raise
                message = (
                    f"Redis at {mask_url(self.endpoints.redis_url)} is at maxmemory and refuses "
                    f"writes (OOM command not allowed): computation {self.spec.name!r} cannot "
                    f"commit batch {batch_id}. Fix: raise Redis maxmemory (CONFIG SET maxmemory "
                    "<bytes>, 0 for no limit) or free memory, and keep maxmemory-policy "
                    "noeviction (evicting would lose state)."
                )
                if self.query is not None and not self.query.isActive:
                    raise  # the query is being stopped: do not hold its stop() up
                if time.monotonic() + delay > deadline:
                    raise MillstreamError(
                        f"{message} Gave up after {OOM_RETRY_SECONDS} s; restart when fixed."
                    ) from None
                log.error("%s Retrying in %.0f s.", message, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def batch_plan(self, batch_id: int, input_wm: Watermark) -> BatchPlan:
        """What every shard task of this batch needs to know, shipped to the executors."""
        output_wm = self.authority.published(self.spec.name) or NONE_KNOWN
        return BatchPlan(
            app=self.topology.app,
            batch_id=batch_id,
            redis_url=self.endpoints.redis_url,
            shards=self.shards,
            shard_config=self.shard_config,
            input_watermark=input_wm,
            gc_watermark=input_wm.system - self.settings.gc_slack_seconds * 1000,
            now=now_ms(),
            user_retries=self.settings.user_retries,
            fail_stop=self.settings.on_user_error == "fail-stop",
            internal_inputs=self.internal_inputs,
            deliveries=self.deliveries,
            in_flight_streams=frozenset(
                s for s in self.spec.outputs if self.topology.consumers_of(s)
            ),
            max_record_bytes=self.settings.max_record_bytes,
            max_future_ms=self.settings.max_future_ms,
            deliver_in_task=self.driver_delivery is None,
            output_watermark=output_wm.event,
        )

    def _process_batch_once(self, batch_df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        input_wm = self.input_watermark()
        planned = time.perf_counter()
        plan = self.batch_plan(batch_id, input_wm)
        spec, shards = self.spec, self.shards
        extractors = dict(spec.inputs)
        batch_df.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", spec.name)
        results: list[ShardResult] = (
            batch_df.rdd.mapPartitions(
                functools.partial(_route, extractors, shards, formats=dict(spec.formats))
            )
            .partitionBy(shards, lambda s: s)
            .mapPartitionsWithIndex(functools.partial(_shard_task, plan, spec))
            .collect()
        )
        collected = time.perf_counter()
        delivery: dict[str, int] = {}
        if self.driver_delivery is not None:
            delivery = self.driver_delivery.deliver(plan, results)
        delivered = time.perf_counter()
        self._after_batch(batch_id, input_wm, results, time.perf_counter() - started, delivery)
        self.last_batch["phases"] = {
            "plan": round(planned - started, 4),
            "spark_jobs": round(collected - planned, 4),
            "shard_task_max": round(max((r.seconds for r in results), default=0.0), 4),
            "shard_task_sum": round(sum(r.seconds for r in results), 4),
            "driver_delivery": round(delivered - collected, 4),
            "after": round(time.perf_counter() - delivered, 4),
        }
        self.client.hset(self.metrics_key, "last_batch", json.dumps(self.last_batch))

    def _after_batch(
        self,
        batch_id: int,
        input_wm: Watermark,
        results: list[ShardResult],
        seconds: float,
        delivery: dict[str, int],
    ) -> None:
        totals: dict[str, int] = dict(delivery)
        consumed: dict[str, dict[int, int]] = {}
        for result in results:
            for name, amount in result.counters.items():
                totals[name] = totals.get(name, 0) + amount
            for stream, parts in result.consumed.items():
                merged = consumed.setdefault(stream, {})
                for partition, offset in parts.items():
                    merged[partition] = max(merged.get(partition, 0), offset)
        pipe = self.client.pipeline(transaction=False)
        for stream, parts in consumed.items():
            if stream in self.internal_inputs:
                known = self._consumed(stream)
                pipe.hset(
                    self._consumed_key(stream),
                    mapping={p: max(o, known.get(p, 0)) for p, o in parts.items()},
                )
        pipe.execute()
        self._retire_in_flight([s for s in consumed if s in self.internal_inputs])
        keys = [ShardKeys(self.topology.app, self.spec.name, s) for s in range(self.shards)]
        oldest = oldest_work(self.client, keys)
        published = self.authority.publish(self.spec.name, merge_min([input_wm, *oldest]))
        pending = [w.event for w in oldest if w.event < INFINITY]
        p99 = (
            min(input_wm.event, percentile_watermark(pending, 0.99)) if pending else input_wm.event
        )
        self.last_batch = {
            "batch_id": batch_id,
            "seconds": round(seconds, 4),
            "input_watermark": input_wm.event,
            "low_watermark": published.event,
            "p99_watermark": p99,
            "round_trips": sum(r.round_trips for r in results),
            "fenced_retries": sum(r.fenced_retries for r in results),
            **totals,
        }
        pipe = self.client.pipeline(transaction=False)
        for name, amount in totals.items():
            pipe.hincrby(self.metrics_key, name, amount)
        pipe.hincrby(self.metrics_key, "batches", 1)
        record_batch_seconds(pipe, self.metrics_key, seconds)
        pipe.hset(
            self.metrics_key,
            mapping={
                "last_batch": json.dumps(self.last_batch),
                "updated_at": now_ms(),
            },
        )
        pipe.execute()
        log.debug("%s batch %s: %s", self.spec.name, batch_id, self.last_batch)
