"""One Structured Streaming query per application: every computation runs in each micro-batch.

Cloud Dataflow's fusion with MillWheel's strong productions, the micro-batch as the delivery
channel (DESIGN.md section 2, "Direction"). Per micro-batch, on the driver:

1. *read*: the batch's injected rows come to the driver once: read there, from the ranges in
   Spark's offset log (Kafka partitions at once), or from Spark as Arrow (`_read`);
2. for each computation in topological order:
   - *input watermark*: injectors' estimates, and the watermarks its producers published
     earlier in this batch (which still count the productions handed to it as their oldest
     work: in flight until it commits);
   - *route*: each row's key by this computation's extractor, its shard by the key, computed
     once; productions handed over by producers run through the same extractors;
   - *run shards*: one Spark job, shards that have input, a due timer or pending productions
     only, several shards per task (`connectors.shard_task.run_shard`: acquire, dedup, fire
     timers, run records, commit). Shards return their checkpointed productions;
   - *publish* its low watermark, and *hand over* its productions to its consumers;
3. *deliver* productions bound outside the application (sinks, dead letters, published
   streams) and *acknowledge* every shard's checkpoints under the lease they were committed
   with, once every consumer committed them and every external target took them. A shard
   whose productions no computation here consumes is settled as soon as it committed, in a
   thread, while the computations after it run; the batch ends when every settlement did.

A crash anywhere re-runs the batch: producers find their checkpoints still pending and hand
them over again, consumers drop what they already applied (same production id, same position:
a replay). A stream consumed only inside the application never touches Kafka.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import json
import logging
import pickle
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import KafkaException

from millstream.connectors.backpressure import (
    FIRST_PAUSE_S,
    LOG_EVERY_S,
    MAX_PAUSE_S,
    drain_shard,
    pending_counts,
    targets_of,
)
from millstream.connectors.delivery import Target, deliver_all
from millstream.connectors.formats import AvroFormat
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.routing import route
from millstream.connectors.segments import MAIN, SegmentLayout
from millstream.connectors.shard_task import STREAM, ShardResult, run_shard
from millstream.connectors.targets import TOPIC_TIMEOUT_S, Endpoints, InternalStreamSink, UserSink
from millstream.connectors.topology import DEAD_LETTERS, ComputationSpec, Topology
from millstream.errors import ConfigurationError, FencedError, MillstreamError
from millstream.fault_points import fault_point
from millstream.injectors import kafka, logfile
from millstream.kafka_admin import check_topics, end_offsets
from millstream.records import Production
from millstream.settings import Settings, mask_url
from millstream.state.client import connect
from millstream.state.keys import ShardKeys, app_key
from millstream.state.shard import ShardConfig, acknowledge, oldest_work
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
COLUMNS = (
    "stream", "id", "key", "value", "timestamp", "system_time", "source", "partition", "offset",
    "headers", "error",
)  # fmt: skip
DELIVERY_THREADS = 8


def _logfile_rows(
    options: dict[str, str], start: dict[str, Any], end: dict[str, Any]
) -> Iterator[list[tuple]]:
    for batch in logfile.read_batch(options, start, end):
        yield _rows(batch)


# The sources the driver reads itself (MILLSTREAM_DRIVER_READ), by format: the same reader
# code their Spark tasks run, giving row tuples (Kafka's without going through Arrow).
DRIVER_READERS = {"millstream-kafka": kafka.read_batch, "millstream-logfile": _logfile_rows}
OOM_RETRY_SECONDS = 600  # how long a batch waits for Redis to accept writes again


def redis_out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write at maxmemory: raised here, or in a Spark task (then only the
    text of the worker's traceback reaches the driver)."""
    text = str(exc)  # Redis says "OOM command not allowed when used memory > 'maxmemory'"
    return isinstance(exc, redis.OutOfMemoryError) or "command not allowed when used memory" in text


def topological_order(topology: Topology, names: Sequence[str]) -> list[str]:
    """Producers before consumers (Kahn's algorithm, declaration order among equals).

    A cycle cannot run in one pass of a batch: refused with the computations on it.
    """
    chosen = [n for n in topology.computations if n in set(names)]
    upstream = {
        n: {p for s in topology.computations[n].inputs for p in topology.producer_of(s)} & set(chosen)
        for n in chosen
    }  # fmt: skip
    order: list[str] = []
    while len(order) < len(chosen):
        ready = [n for n in chosen if n not in order and upstream[n] <= set(order)]
        if not ready:
            cycle = sorted(n for n in chosen if n not in order)
            raise ConfigurationError(
                f"computations {cycle} form a cycle: a fused query runs each micro-batch in one "
                "pass from producers to consumers, so a cycle cannot run yet"
            )
        order.extend(ready)
    return order


@dataclass
class Stage:
    """One computation's wiring inside a fused query."""

    spec: ComputationSpec
    shards: int
    config: ShardConfig
    targets: dict[str, tuple[Target, ...]]  # stream -> targets outside this query
    consumers: dict[str, list[str]]  # stream -> computations of this query reading it
    # Output streams that computations of another query read (from the stream's topic): their
    # deliveries are recorded in flight, to hold those consumers' watermarks.
    elsewhere: frozenset[str]
    # Inputs produced by computations of another query: read from their topics.
    topic_inputs: frozenset[str]
    metrics_key: str
    last_batch: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def keys(self, app: str) -> list[ShardKeys]:
        return [ShardKeys(app, self.name, s) for s in range(self.shards)]


@dataclass
class _Done:
    """A shard's committed, unacknowledged productions after its task: what the end of the
    batch delivers outside and acknowledges."""

    stage: Stage
    plan: BatchPlan
    result: ShardResult


# Formats whose decoded data travels to a task with its row: they decode into builtins and
# standard-library types only (pickled by the standard library), and decoding again would cost
# more than carrying it. JSON is decoded again in the task (msgspec: about 0.3 us a value,
# less than pickling and unpickling the decoded object). A user's ValueFormat may return
# instances of classes only its driver script defines, which only cloudpickle carries: its
# values are decoded again in the task too.
_CARRIED_FORMATS = (AvroFormat,)


def _task_payload(spec: ComputationSpec, group: list[tuple[int, list[TaskInput]]]) -> bytes:
    """One Spark task's shards and their rows, pickled here by the standard library as plain
    tuples: `parallelize` would cloudpickle them, 0.29 s for 20,000 rows on this machine
    against 0.035 s. Decoded values travel only for the formats above; the task decodes the
    others again (`shard_task.decode_inputs`)."""
    carried = {s for s, f in spec.formats.items() if type(f) in _CARRIED_FORMATS}
    return pickle.dumps(
        [
            (
                shard,
                [
                    (i.key, i.row, i.error, i.data, i.decoded)
                    if not i.decoded or i.row[STREAM] in carried
                    else (i.key, i.row, i.error, None, False)
                    for i in items
                ],
            )
            for shard, items in group
        ],
        protocol=pickle.HIGHEST_PROTOCOL,
    )


def balanced_groups(shards: Sequence[int], rows: dict[int, int], groups: int) -> list[list[int]]:
    """`shards` in `groups` groups of about equal rows (largest first, each to the lightest
    group so far): keys are skewed (a Zipf workload's busiest shard can hold a third of a
    batch), and the job lasts as long as its heaviest task. Each group is in shard order."""
    heap: list[tuple[int, int, int, list[int]]] = [
        (0, 0, i, []) for i in range(max(1, min(groups, len(shards))))
    ]  # (rows, shards, index, members): ties go to the group with fewer shards
    for shard in sorted(shards, key=lambda s: (-rows.get(s, 0), s)):
        load, count, index, members = heapq.heappop(heap)
        members.append(shard)
        heapq.heappush(heap, (load + rows.get(shard, 0), count + 1, index, members))
    return [sorted(g[3]) for g in sorted(heap, key=lambda g: g[2])]


def _fused_task(
    plan: BatchPlan, spec: ComputationSpec, payloads: Iterator[bytes]
) -> Iterator[bytes]:
    """Executor side: run the shards of this task one after the other; each result goes back
    pickled by the standard library too (cloudpickle is several times slower)."""
    with _no_cyclic_gc():
        results = [
            pickle.dumps(
                run_shard(plan, spec, shard, [TaskInput(*item) for item in items]),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            for payload in payloads
            for shard, items in pickle.loads(payload)
        ]
    yield from results


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Batch work without the cyclic garbage collector: it allocates a row's worth of objects
    per record, few of them in cycles, and every collection the allocations trigger would walk
    the process's whole heap (Spark's and py4j's objects in the driver). What cycles the batch
    leaves are collected once it is over. The previous state is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _offset_log(path: Path) -> list[dict]:
    """The source offsets of one entry of Spark's offset log ("v1", metadata, one line per
    source); a source with no offset yet is "-"."""
    lines = path.read_text().splitlines()
    if not lines or lines[0] != "v1":
        raise ValueError(f"{path}: not a v1 offset log entry")
    out = []
    for line in lines[2:]:
        if line.strip() in ("", "-"):
            raise ValueError(f"{path}: a source without an offset")
        out.append(json.loads(line))
    return out


def _rows(table: Any) -> list[tuple]:
    """Arrow rows as the tuples the shard tasks read (headers as (key, value) pairs)."""
    if table.num_rows == 0:
        return []
    columns = [table.column(name).to_pylist() for name in COLUMNS]
    headers = COLUMNS.index("headers")
    columns[headers] = [
        None if items is None else [(h["key"], h["value"]) for h in items]
        for items in columns[headers]
    ]
    return list(zip(*columns, strict=True))


def _handed_row(producer: str, shard: int, production: Production) -> tuple:
    """A checkpointed production as a consumer's input row. Its position (producer, shard,
    seq) is fixed at the checkpoint, so a production handed over again after a crash is a
    replay to the consumer's catalog, and is dropped."""
    return (
        production.stream,
        production.id,
        production.key.encode("utf-8", "surrogatepass"),
        production.value,
        production.timestamp,
        production.system_time,
        producer,
        shard,
        production.seq,
        list(production.headers),
        None,
    )


class FusedRunner:
    """One fused streaming query over some of an application's computations: the batch
    protocol above.

    An application starts with one (`MAIN`) running all its computations. A computation added
    to a running application runs in a query of its own (`segment`, named after it), so the
    others keep their progress: it reads its injected streams with its own positions, and the
    streams it shares with the other queries through their Kafka topics.
    """

    def __init__(
        self,
        topology: Topology,
        settings: Settings,
        endpoints: Endpoints,
        names: Sequence[str] | None = None,
        segment: str = MAIN,
        reads: Sequence[str] = (),
    ) -> None:
        self.topology = topology
        self.settings = settings
        self.endpoints = endpoints
        self.segment = segment
        self.extra_reads = frozenset(reads)  # read although no computation here reads them
        self.order = topological_order(topology, names or list(topology.computations))
        self.client = connect(endpoints.redis_url)
        self.authority = WatermarkAuthority(self.client, topology.app)
        self.stages = {name: self._stage(topology.computations[name]) for name in self.order}
        self.partitions: dict[str, int] = {}  # topic input -> its topic's partition count
        self.sources: list[tuple[str, dict[str, str]]] = []  # read by the query, in order
        self.query: Any = None
        self.last_batch: dict[str, Any] = {}
        self._last_logged: tuple[int, list[dict] | None] = (-1, None)
        self._pool = ThreadPoolExecutor(DELIVERY_THREADS, thread_name_prefix="millstream-deliver")

    # --- wiring ------------------------------------------------------------------------------
    def _stage(self, spec: ComputationSpec) -> Stage:
        from millstream.state.shard_count import record_shard_count

        shards = spec.options.shards or self.settings.shards
        record_shard_count(self.client, self.topology.app, spec.name, shards)
        here = set(self.order)
        consumers = {
            s: [c for c in self.topology.consumers_of(s) if c in here] for s in spec.outputs
        }
        elsewhere = frozenset(
            s for s in spec.outputs if any(c not in here for c in self.topology.consumers_of(s))
        )
        return Stage(
            spec=spec,
            shards=shards,
            config=ShardConfig(
                bucket_ms=self.settings.bucket_seconds * 1000,
                bloom_expected=self.settings.bloom_expected,
                bloom_fp_rate=self.settings.bloom_fp_rate,
                use_bloom=spec.options.use_bloom,
            ),
            targets={s: self._targets(s, consumers[s], s in elsewhere) for s in spec.outputs},
            consumers={s: c for s, c in consumers.items() if c},
            elsewhere=elsewhere,
            topic_inputs=frozenset(
                s
                for s in spec.inputs
                if s not in self.topology.sources
                and any(p not in here for p in self.topology.producer_of(s))
            ),
            metrics_key=app_key(self.topology.app, "metrics", spec.name),
        )

    def _targets(self, stream: str, consumers: list[str], elsewhere: bool) -> tuple[Target, ...]:
        """Where a stream goes outside this query: its sink; its topic when something outside
        may read it (dead letters, a computation of another query, a stream nothing consumes,
        a published one). The topic comes first: in-flight records are tracked on target 0."""
        kafka = tuple(sorted(self.endpoints.kafka.items()))
        targets: list[Target] = []
        sink = self.topology.sinks.get(stream)
        external_topic = stream == DEAD_LETTERS or stream in self.topology.published or elsewhere
        if external_topic or (not consumers and sink is None):
            targets.append(Target(InternalStreamSink(self.topology.topic_of(stream), kafka), 0))
        if sink is not None:
            targets.append(Target(UserSink.bound(sink, dict(self.endpoints.kafka)), len(targets)))
        return tuple(targets)

    def topics(self) -> list[str]:
        """The Kafka topics this query writes (and so creates at start)."""
        return sorted(
            {
                target.factory.topic
                for stage in self.stages.values()
                for targets in stage.targets.values()
                for target in targets
                if isinstance(target.factory, InternalStreamSink)
            }
        )

    def topic_inputs(self) -> list[str]:
        """Streams this query reads from topics other queries write."""
        needed = {s for stage in self.stages.values() for s in stage.topic_inputs}
        kept = {s for s in self.extra_reads if s not in self.topology.sources}
        return sorted(needed | kept)

    def injected_inputs(self) -> list[str]:
        """Injected streams this query reads."""
        needed = {s for n in self.order for s in self.topology.computations[n].inputs}
        return sorted((needed | self.extra_reads) & set(self.topology.sources))

    def reads(self) -> list[str]:
        """Every stream this query reads: a Spark checkpoint pins them."""
        return sorted({*self.injected_inputs(), *self.topic_inputs()})

    def streams(self) -> set[str]:
        """Every stream this query's computations read or write (to tell which queries share
        a stream)."""
        return {
            s for stage in self.stages.values() for s in (*stage.spec.inputs, *stage.spec.outputs)
        }

    def _instance(self, source_name: str) -> str:
        """An injector instance per query: each reads from its own positions."""
        suffix = "" if self.segment == MAIN else f"/{self.segment}"
        return f"{source_name}@{self.topology.app}{suffix}"

    def input_frame(self, spark: Any) -> Any:
        """Every injected stream the query's computations read, each source read once, and
        the topics of streams that other queries produce."""
        streams = self.injected_inputs()
        topic_inputs = self.topic_inputs()
        if not streams and not topic_inputs:
            raise ConfigurationError(
                f"computations {self.order} read no injected stream: declare one with .source()"
            )
        sources: list[tuple[str, dict[str, str]]] = []  # (format, options), in union order
        for stream in streams:
            for src in self.topology.sources[stream]:
                options = dict(src.options)
                if src.format == "millstream-kafka":
                    options.update(self._kafka_options())
                options.update(self._tick_options())
                options.update(
                    {
                        "stream": stream,
                        "instance": self._instance(src.name),
                        "app": self.topology.app,
                        "redis.url": self.endpoints.redis_url,
                        "idleSlackMs": str(self.settings.idle_slack_ms),
                        "outageGraceMs": str(self.settings.outage_grace_ms),
                    }
                )
                sources.append((src.format, options))
        for stream in topic_inputs:
            start = next(
                (
                    stage.spec.options.start
                    for stage in self.stages.values()
                    if stream in stage.topic_inputs
                ),
                "latest",
            )
            options = {
                **self._kafka_options(),
                **self._tick_options(),
                "stream": stream,
                "topics": self.topology.topic_of(stream),
                "startingOffsets": start,
                "idHeader": "ms-id",
            }
            sources.append(("millstream-kafka", options))
        self.sources = sources
        frames = [spark.readStream.format(fmt).options(**opts).load() for fmt, opts in sources]
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _kafka_options(self) -> dict[str, str]:
        kafka = dict(self.endpoints.kafka)
        options = {
            "bootstrap.servers": kafka.pop("bootstrap.servers"),
            "maxFutureMs": str(self.settings.max_future_ms),
        }
        options.update({f"kafka.{key}": value for key, value in kafka.items()})
        return options

    def _tick_options(self) -> dict[str, str]:
        return {
            "tickMs": str(max(100, self.settings.trigger_ms)),
            "maxRecordsPerTrigger": str(self.settings.max_records_per_batch),
        }

    @property
    def checkpoint(self) -> str:
        suffix = "" if self.segment == MAIN else f"-{self.segment}"
        return f"{self.settings.checkpoint_dir}/{self.topology.app}/fused{suffix}"

    def close(self) -> None:
        """Release the delivery threads of a runner that will not run again (replaced or
        removed at run time); its query is stopped by then."""
        self._pool.shutdown(wait=False)

    def read_partitions(self) -> None:
        """Each topic input's partition count, from the broker's metadata: a topic created
        beforehand may have more than the default, and records in flight in partitions the
        watermark did not look at would not hold it. Read at start: a running query's topics
        keep their partitions (adding some would move keys between them)."""
        topics = {s: self.topology.topic_of(s) for s in self.topic_inputs()}
        if topics:
            counts = check_topics(self.endpoints.kafka, sorted(topics.values()), TOPIC_TIMEOUT_S)
            self.partitions = {s: counts[t] for s, t in topics.items()}

    def _mark_catch_up(self) -> None:
        """A computation starting from the earliest record of a topic another query writes
        reads records delivered before anything tracked them in flight: until it has read up
        to the topic's end as of now, nothing bounds their times, so its input watermark from
        that stream stays unknown (no timer fires on it, no record of that history is late)."""
        for stage in self.stages.values():
            for stream in stage.topic_inputs:
                if stage.spec.options.start != "earliest":
                    continue
                if self._consumed(stage.name, stream):
                    continue  # it has read from the topic before: in-flight tracking holds it
                key = app_key(self.topology.app, "catchup", stage.name, stream)
                if self.client.exists(key):
                    continue
                ends = end_offsets(
                    self.endpoints.kafka,
                    self.topology.topic_of(stream),
                    self.partitions[stream],
                    TOPIC_TIMEOUT_S,
                )
                if any(ends.values()):
                    self.client.hset(key, mapping={p: o for p, o in ends.items() if o})

    def _caught_up(self, stage: Stage, stream: str, consumed: dict[int, int]) -> bool:
        key = app_key(self.topology.app, "catchup", stage.name, stream)
        raw = self.client.hgetall(key)
        if not raw:
            return True
        if all(consumed.get(int(p), 0) >= int(o) for p, o in raw.items()):
            self.client.delete(key)
            return True
        return False

    def start(self, spark: Any) -> Any:
        """Start the query. The topics it reads must exist (their partition counts are read
        from the broker: in-flight records in every partition hold the consumers' watermarks)."""
        self.read_partitions()
        self._mark_catch_up()
        self._last_logged = (-1, None)  # a new query: its offset log is read afresh
        suffix = "" if self.segment == MAIN else f".{self.segment}"
        self.query = (
            self.input_frame(spark)
            .writeStream.queryName(f"{self.topology.app}.fused{suffix}")
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime=f"{self.settings.trigger_ms} milliseconds")
            .start()
        )
        return self.query

    # --- the per-batch protocol --------------------------------------------------------------
    def process_batch(self, batch_df: Any, batch_id: int) -> None:
        """Run one micro-batch; while Redis is at maxmemory, say so and run it again (a refused
        commit writes nothing and a re-run is a replay: shards that did commit see their records as
        replays). Any other failure fails the query (Application.check restarts it)."""
        deadline = time.monotonic() + OOM_RETRY_SECONDS
        delay = 1.0
        while True:
            try:
                with _no_cyclic_gc():
                    self._run_batch(batch_df, batch_id)
                return
            except Exception as exc:
                if not redis_out_of_memory(exc):
                    raise
                message = (
                    f"Redis at {mask_url(self.endpoints.redis_url)} is at maxmemory and refuses "
                    f"writes (OOM command not allowed): application {self.topology.app!r} "
                    f"cannot commit batch {batch_id}. Fix: raise Redis maxmemory (CONFIG SET "
                    "maxmemory <bytes>, 0 for no limit) or free memory, and keep "
                    "maxmemory-policy noeviction (evicting would lose state)."
                )
                if self.query is not None and not self.query.isActive:
                    raise
                if time.monotonic() + delay > deadline:
                    raise MillstreamError(
                        f"{message} Gave up after {OOM_RETRY_SECONDS} s; restart when fixed."
                    ) from None
                log.error("%s Retrying in %.0f s.", message, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _hold_while_backlogged(self, batch_id: int) -> None:
        """Backpressure: while a shard holds more than MILLSTREAM_MAX_PENDING_PRODUCTIONS
        checkpoints bound outside (its sink is down or slow), take no new input: re-deliver
        them from here, with backoff, until every shard is under the limit. Checkpoints that
        consumers here still have to see wait for the batch's hand-over: they never block it
        (so a stream both consumed here and sunk outside gets no backpressure yet)."""
        limit = self.settings.max_pending_productions
        for stage in self.stages.values():
            if not any(stage.targets.values()):
                continue
            keys = stage.keys(self.topology.app)
            counts = pending_counts(self.client, keys)
            if max(counts, default=0) <= limit:
                continue
            # Streams bound only outside: one also consumed here is acknowledged only after
            # its hand-over, in a batch.
            outside = frozenset(
                s for s, t in stage.targets.items() if t and s not in stage.consumers
            )
            started, pause, last_log, error = time.monotonic(), FIRST_PAUSE_S, 0.0, None
            while True:
                if self.query is not None and not self.query.isActive:
                    raise MillstreamError(
                        f"application {self.topology.app!r} was stopped while waiting for its "
                        f"targets; micro-batch {batch_id} stays unprocessed and runs on restart"
                    )
                plan = self._plan(stage, batch_id, NONE_KNOWN, now_ms())
                over = [s for s, n in enumerate(counts) if n > limit]
                drain = functools.partial(drain_shard, plan, stage.spec, only=outside)
                drained = list(self._pool.map(drain, over))
                error = next((d.error for d in drained if d.error), error)
                counts = pending_counts(self.client, keys)
                if max(counts) <= limit or not any(d.pending for d in drained):
                    break  # under the limit, or what is left waits for the hand-over
                if time.monotonic() - last_log >= LOG_EVERY_S:
                    last_log = time.monotonic()
                    log.warning(
                        "computation %s is waiting on target(s) %s: %d productions pending "
                        "(MILLSTREAM_MAX_PENDING_PRODUCTIONS=%d per shard); not taking new "
                        "input for %.0fs%s",
                        stage.name,
                        targets_of(stage.targets, {s for d in drained for s in d.streams}),
                        sum(counts),
                        limit,
                        time.monotonic() - started,
                        f"; last error: {error}" if error else "",
                    )
                    since = now_ms() - int((time.monotonic() - started) * 1000)
                    self.client.hset(
                        stage.metrics_key,
                        "backpressure",
                        json.dumps({"since": since, "pending": counts}),
                    )
                time.sleep(pause)
                pause = min(MAX_PAUSE_S, pause * 2)
            waited = time.monotonic() - started
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(stage.metrics_key, "backpressure_waits", 1)
            pipe.hincrbyfloat(stage.metrics_key, "backpressure_seconds", round(waited, 3))
            pipe.hdel(stage.metrics_key, "backpressure")
            pipe.execute()
            log.warning(
                "computation %s: targets accept productions again after %.1fs; taking new input",
                stage.name,
                waited,
            )

    def _run_batch(self, batch_df: Any, batch_id: int) -> None:
        """DESIGN.md section 2 as one pass: read; per computation in topological order its
        input watermark, route, run its busy shards (acquire, dedup, fire timers, run records,
        commit: `shard_task.run_shard`), publish and hand over; then deliver and acknowledge
        (started at once for productions no computation here consumes)."""
        self._hold_while_backlogged(batch_id)
        started = time.perf_counter()
        by_stream, rows = self._read(batch_df, batch_id)
        phases: dict[str, float] = {"read": round(time.perf_counter() - started, 4)}
        now = now_ms()
        injected = self._injected_watermarks()
        at_end = self._end_estimates(batch_id, injected)
        published: dict[str, Watermark] = {}
        handed: dict[str, list[tuple]] = {}
        done: list[_Done] = []
        settling: list[tuple[_Done, Future[dict[str, int]]]] = []
        try:
            for name in self.order:
                stage = self.stages[name]
                handing = self._run_stage(
                    batch_df.sparkSession, batch_id, stage, now, (injected, at_end, published),
                    (by_stream, handed), phases,
                )  # fmt: skip
                for item in handing:
                    if any(p.stream in stage.consumers for p in item.result.outstanding):
                        done.append(item)  # acknowledged once its consumers committed
                    else:
                        # Nothing here consumes them: delivered while the next computations run.
                        settling.append((item, self._pool.submit(self._settle, item)))
        except BaseException:
            # No settlement goes on behind a failed batch (its re-run settles them again).
            futures_wait([future for _, future in settling])
            raise
        if done:
            # Consumers committed; nothing they consumed is acknowledged yet.
            fault_point("fused_after_consumers_commit")
        delivery_started = time.perf_counter()
        delivery = self._deliver_and_acknowledge(done, settling)
        if (done or settling) and at_end is not None:
            self._republish(at_end)
        phases["deliver_ack"] = round(time.perf_counter() - delivery_started, 4)
        self._record(batch_id, delivery, time.perf_counter() - started, rows, phases)

    def _run_stage(
        self,
        spark: Any,
        batch_id: int,
        stage: Stage,
        now: int,
        marks: tuple[dict[str, Watermark], dict[str, Watermark] | None, dict[str, Watermark]],
        rows: tuple[dict[str, list[tuple]], dict[str, list[tuple]]],
        phases: dict[str, float],
    ) -> list[_Done]:
        """One computation's part of the batch: input watermark, route, run its busy shards,
        publish its low watermark, hand its productions over to its consumers (`rows[1]`).
        `marks`: the injected estimates, those at the batch's end and what earlier
        computations published in this batch (added to here)."""
        started = time.perf_counter()
        name = stage.name
        injected, at_end, published = marks
        by_stream, handed = rows
        input_wm = self._input_watermark(stage, injected, published)
        end_wm = self._end_watermark(stage, at_end)
        # Published before the tasks run: a firing seen committed is never ahead of it.
        self.authority.publish(f"{name}#input", end_wm or input_wm)
        plan = self._plan(stage, batch_id, input_wm, now, end_wm)
        route_started = time.perf_counter()
        inputs = self._route(stage, by_stream, handed)
        routed = time.perf_counter()
        busy = self._busy_shards(stage, inputs, (end_wm or input_wm).event, now)
        results = self._run_shards(spark, plan, stage, inputs, busy)
        phases[f"{name}:route"] = round(routed - route_started, 4)
        phases[f"{name}:shards"] = round(time.perf_counter() - routed, 4)
        self._record_consumed(stage, results)
        oldest = oldest_work(self.client, stage.keys(self.topology.app))
        published[name] = self.authority.publish(name, merge_min([end_wm or input_wm, *oldest]))
        handing = self._hand_over(stage, plan, results, handed)
        if handing:
            # This computation committed, the ones after it have not run yet.
            fault_point(f"fused_after_stage_{name}")
        stage.last_batch = self._stage_metrics(
            stage, batch_id, input_wm, published[name], oldest, results, busy
        )
        phases[name] = round(time.perf_counter() - started, 4)
        return handing

    def _read(self, batch_df: Any, batch_id: int) -> tuple[dict[str, list[tuple]], int]:
        """The batch's rows in the driver, grouped by stream.

        Kafka and log-file sources are read here, from the ranges Spark logged for the batch
        before running it (its offset log), with the injector's own reader (Kafka's with warm
        consumers): the rows Spark would produce, without a Python worker per partition, the
        round trip through the JVM and the Arrow collection (0.8 s of a 1.25 s batch measured
        that way). Otherwise (batch 0, a checkpoint not on the local file system), Spark reads
        them and they reach the driver once as Arrow.
        """
        logged = self._logged_offsets(batch_id)
        if logged is None:
            rows = _rows(batch_df.toArrow())
        else:
            rows = [
                row
                for (fmt, options), (start, end) in zip(self.sources, logged, strict=True)
                for chunk in DRIVER_READERS[fmt](options, start, end)
                for row in chunk
            ]
        by_stream: dict[str, list[tuple]] = {}
        for row in rows:
            by_stream.setdefault(row[0], []).append(row)
        return by_stream, len(rows)

    def _logged(self, batch_id: int) -> list[dict] | None:
        """Entry `batch_id` of the query's offset log, None when it cannot be read here (a
        checkpoint not on the local file system). The batch's own entry is read once: the
        driver read and the end estimates both need it."""
        if self._last_logged[0] == batch_id:
            return self._last_logged[1]
        path = Path(self.checkpoint.removeprefix("file:")) / "offsets" / str(batch_id)
        try:
            entry: list[dict] | None = _offset_log(path)
        except (OSError, ValueError) as exc:
            log.debug("batch %s: offset log not readable here (%s)", batch_id, exc)
            entry = None
        self._last_logged = (batch_id, entry)
        return entry

    def _logged_offsets(self, batch_id: int) -> list[tuple[dict, dict]] | None:
        """Each source's (start, end) offsets of this batch from the query's offset log, when
        every source is a Kafka or log-file injector and the log can be read here; else None."""
        if batch_id == 0 or not self.settings.driver_read:
            return None
        if any(fmt not in DRIVER_READERS for fmt, _ in self.sources):
            return None
        ends = self._logged(batch_id)
        starts = self._logged(batch_id - 1)
        if ends is None or starts is None:
            return None  # Spark reads
        if len(ends) != len(self.sources) or len(starts) != len(self.sources):
            return None
        for (fmt, options), end in zip(self.sources, ends, strict=True):
            if fmt == "millstream-logfile":
                if "files" not in end:
                    return None  # not the source this slot was built for: let Spark read
                continue
            topics = set(options["topics"].split(",")) if "topics" in options else None
            logged = {key.rsplit(":", 1)[0] for key in end.get("p", {})}
            if "p" not in end or (topics is not None and not logged <= {t.strip() for t in topics}):
                return None  # not the source this slot was built for: let Spark read
        return list(zip(starts, ends, strict=True))

    def _hand_over(
        self,
        stage: Stage,
        plan: BatchPlan,
        results: list[ShardResult],
        handed: dict[str, list[tuple]],
    ) -> list[_Done]:
        """Committed productions become consumers' input rows later in this batch; every
        shard with checkpoints is settled (delivered outside, acknowledged) at the end."""
        done = []
        for result in results:
            if result.outstanding:
                done.append(_Done(stage, plan, result))
            for production in result.outstanding:
                if production.stream in stage.consumers:
                    handed.setdefault(production.stream, []).append(
                        _handed_row(stage.name, result.shard, production)
                    )
        return done

    def _record_consumed(self, stage: Stage, results: list[ShardResult]) -> None:
        """Topic inputs: the offsets read past, per partition, so the producers' in-flight
        records below them stop holding this computation's watermark."""
        consumed: dict[str, dict[int, int]] = {}
        for result in results:
            for stream, parts in result.consumed.items():
                if stream not in stage.topic_inputs:
                    continue
                merged = consumed.setdefault(stream, {})
                for partition, offset in parts.items():
                    merged[partition] = max(merged.get(partition, 0), offset)
        for stream, parts in consumed.items():
            key = app_key(self.topology.app, "consumed", stage.name, stream)
            known = self._consumed(stage.name, stream)
            self.client.hset(key, mapping={p: max(o, known.get(p, 0)) for p, o in parts.items()})
            self._retire_in_flight(stream)

    def _consumed(self, computation: str, stream: str) -> dict[int, int]:
        raw = self.client.hgetall(app_key(self.topology.app, "consumed", computation, stream))
        return {int(k): int(v) for k, v in raw.items()}

    def _retire_in_flight(self, stream: str) -> None:
        """Drop in-flight entries every consumer of the stream read past (DESIGN.md 6): pure
        garbage collection, since `in_flight` reads entries at or beyond a consumer's offsets
        only. A partition some consumer has not read yet keeps all its entries."""
        layout = SegmentLayout(self.client, self.topology.app).load()
        producers = set(self.topology.producer_of(stream))
        # Consumers in a producer's own query take the stream by hand-over, not from its topic.
        inside = {
            c
            for seg in layout.values()
            if producers & set(seg.computations)
            for c in seg.computations
        }
        floor: dict[int, int] | None = None
        for consumer in self.topology.consumers_of(stream):
            if consumer in inside and consumer not in self.order:
                continue
            offsets = self._consumed(consumer, stream)
            floor = (
                offsets
                if floor is None
                else {p: min(o, offsets[p]) for p, o in floor.items() if p in offsets}
            )
        if floor:
            self.authority.retire_in_flight(stream, floor)

    def _injected_watermarks(self) -> dict[str, Watermark]:
        """Each injected stream's estimate (min over its sources), less its out-of-order bound."""
        out: dict[str, Watermark] = {}
        for stream, sources in self.topology.sources.items():
            estimate = self.authority.injector_watermark(
                stream, [self._instance(s.name) for s in sources]
            )
            out[stream] = self._less_bound(stream, estimate)
        return out

    def _less_bound(self, stream: str, estimate: Watermark) -> Watermark:
        """An injector estimate less its stream's out-of-order bound (`max_out_of_order_ms`)."""
        bound = self.topology.out_of_order_ms.get(stream, 0)
        if estimate.event > NONE_KNOWN.event:
            return Watermark(estimate.event - bound, estimate.system)
        return estimate

    def _input_watermark(
        self, stage: Stage, injected: dict[str, Watermark], published: dict[str, Watermark]
    ) -> Watermark:
        """min over input streams: injector estimates; producers' watermarks as published
        after their commits in this batch (their handed productions still count there); for a
        stream another query produces, also its records delivered to the topic and not yet
        read here (in flight).

        The caller publishes it (monotonically, as `<computation>#input`); the batch judges
        lateness on the value computed now: a re-run of a batch whose first attempt published
        its end watermark there must not find its own records late."""
        parts: list[Watermark] = []
        for stream in stage.spec.inputs:
            if stream in self.topology.sources:
                parts.append(injected.get(stream, NONE_KNOWN))
                continue
            for producer in self.topology.producer_of(stream):
                value = published.get(producer) or self.authority.published(producer)
                parts.append(value or NONE_KNOWN)
            if stream in stage.topic_inputs:
                consumed = self._consumed(stage.name, stream)
                partitions = self.partitions[stream]
                parts.append(self.authority.in_flight(stream, partitions, consumed))
                if not self._caught_up(stage, stream, consumed):
                    parts.append(NONE_KNOWN)
        return merge_min(parts)

    def _end_estimates(
        self, batch_id: int, injected: dict[str, Watermark]
    ) -> dict[str, Watermark] | None:
        """Each injected stream's watermark once this batch's records are applied: the
        estimates the injectors stored with the batch's end offsets in Spark's offset log (what
        their commit publishes later), less the out-of-order bound. None when the log cannot
        be read here (a checkpoint not on the local file system)."""
        entry = self._logged(batch_id)
        if entry is None or len(entry) != len(self.sources):
            return None
        ends: dict[str, Watermark] = {}
        for (_fmt, options), offset in zip(self.sources, entry, strict=True):
            if "instance" not in options:
                continue  # a topic another query writes: its producers bound it, not an estimate
            try:
                event, system = (int(v) for v in offset["wm"])
            except (KeyError, TypeError, ValueError):
                return None
            stream = options["stream"]
            estimate = Watermark(event, system)
            ends[stream] = estimate if stream not in ends else ends[stream].min(estimate)
        out = dict(injected)
        for stream, estimate in ends.items():
            out[stream] = self._less_bound(stream, estimate).max(injected.get(stream, NONE_KNOWN))
        return out

    def _end_watermark(self, stage: Stage, at_end: dict[str, Watermark] | None) -> Watermark | None:
        """The input watermark of a computation that reads injected streams only, once it
        applied the batch's records (it read them up to the end offsets); None otherwise."""
        if at_end is None or any(s not in self.topology.sources for s in stage.spec.inputs):
            return None
        return merge_min([at_end.get(s, NONE_KNOWN) for s in stage.spec.inputs])

    def _republish(self, at_end: dict[str, Watermark]) -> None:
        """After the acknowledgements, each computation's low watermark again, in topological
        order: the productions just acknowledged no longer hold it, and its injected inputs
        count at the batch's end estimates. Without this, a window count emitted in this batch
        would hold its producer's watermark at the window's end until the next batch."""
        published: dict[str, Watermark] = {}
        for name in self.order:
            stage = self.stages[name]
            input_wm = self._input_watermark(stage, at_end, published)
            self.authority.publish(f"{name}#input", input_wm)
            oldest = oldest_work(self.client, stage.keys(self.topology.app))
            published[name] = self.authority.publish(name, merge_min([input_wm, *oldest]))

    def _plan(
        self,
        stage: Stage,
        batch_id: int,
        input_wm: Watermark,
        now: int,
        end_wm: Watermark | None = None,
    ) -> BatchPlan:
        """What every shard task of this computation's part of the batch needs."""
        output_wm = self.authority.published(stage.name) or NONE_KNOWN
        internal = frozenset(s for s in stage.spec.inputs if s not in self.topology.sources)
        return BatchPlan(
            app=self.topology.app,
            batch_id=batch_id,
            redis_url=self.endpoints.redis_url,
            shards=stage.shards,
            shard_config=stage.config,
            input_watermark=input_wm,
            gc_watermark=input_wm.system - self.settings.gc_slack_seconds * 1000,
            now=now,
            user_retries=self.settings.user_retries,
            fail_stop=self.settings.on_user_error == "fail-stop",
            internal_inputs=internal,
            deliveries=stage.targets,
            in_flight_streams=stage.elsewhere,
            max_record_bytes=self.settings.max_record_bytes,
            max_future_ms=self.settings.max_future_ms,
            deliver_in_task=False,
            output_watermark=output_wm.event,
            handed_streams=frozenset(stage.consumers),
            end_watermark=end_wm,
        )

    def _route(
        self, stage: Stage, by_stream: dict[str, list[tuple]], handed: dict[str, list[tuple]]
    ) -> dict[int, list[TaskInput]]:
        """Each input row's shard under this computation's key extractors, computed once."""
        extractors = dict(stage.spec.inputs)
        rows = [row for s in extractors for row in (*by_stream.get(s, ()), *handed.get(s, ()))]
        inputs: dict[int, list[TaskInput]] = {}
        routed = route(extractors, stage.shards, iter(rows), stage.spec.formats)
        for shard, item in routed:
            inputs.setdefault(shard, []).append(item)
        return inputs

    def _busy_shards(
        self, stage: Stage, inputs: dict[int, list[TaskInput]], event_wm: int, now: int
    ) -> list[int]:
        """Shards with input, a due timer or pending productions: the others run no task."""
        idle = [s for s in range(stage.shards) if s not in inputs]
        if not idle:
            return list(range(stage.shards))
        pipe = self.client.pipeline(transaction=False)
        for shard in idle:
            keys = ShardKeys(self.topology.app, stage.name, shard)
            pipe.zrangebyscore(keys.timers("event"), "-inf", event_wm, start=0, num=1)
            pipe.zrangebyscore(keys.timers("wall"), "-inf", now, start=0, num=1)
            pipe.hlen(keys.productions)
        answers = pipe.execute()
        working = {
            shard
            for i, shard in enumerate(idle)
            if answers[3 * i] or answers[3 * i + 1] or answers[3 * i + 2]
        }
        return sorted(set(inputs) | working)

    def _run_shards(
        self,
        spark: Any,
        plan: BatchPlan,
        stage: Stage,
        inputs: dict[int, list[TaskInput]],
        busy: list[int],
    ) -> list[ShardResult]:
        """One Spark job: the busy shards, grouped into at most as many tasks as cores, of
        about equal rows (`balanced_groups`).

        A small batch (MILLSTREAM_SMALL_BATCH_ROWS) runs its shards in this process instead:
        scheduling a Spark job costs about 0.2 s here, running a few shards a few ms. The
        protocol is the same (leases, dedup, one commit per shard).
        """
        if not busy:
            return []
        rows = sum(len(inputs.get(s, ())) for s in busy)
        if rows <= self.settings.small_batch_rows:
            return [run_shard(plan, stage.spec, s, list(inputs.get(s, []))) for s in busy]
        context = spark.sparkContext
        slots = max(1, min(len(busy), context.defaultParallelism))
        payloads = [
            _task_payload(stage.spec, [(s, inputs.get(s, [])) for s in group])
            for group in balanced_groups(busy, {s: len(inputs.get(s, ())) for s in busy}, slots)
        ]
        context.setLocalProperty("spark.scheduler.pool", "millstream")
        job = context.parallelize(payloads, slots).mapPartitions(
            functools.partial(_fused_task, plan, stage.spec)
        )
        return [pickle.loads(result) for result in job.collect()]

    def _deliver_and_acknowledge(
        self, done: list[_Done], settling: Sequence[tuple[_Done, Future[dict[str, int]]]] = ()
    ) -> dict[str, dict[str, int]]:
        """Deliver what leaves the application, then acknowledge each shard's checkpoints;
        wait for the settlements started earlier in the batch (`settling`): a batch ends with
        every production it checkpointed delivered or its failure noted."""
        futures = [*settling, *((d, self._pool.submit(self._settle, d)) for d in done)]
        out: dict[str, dict[str, int]] = {}
        for item, future in futures:
            totals = out.setdefault(item.stage.name, {})
            for name, amount in future.result().items():
                totals[name] = totals.get(name, 0) + amount
        return out

    def _settle(self, item: _Done) -> dict[str, int]:
        stage, result = item.stage, item.result
        keys = ShardKeys(self.topology.app, stage.name, result.shard)
        outside = [p for p in result.outstanding if stage.targets.get(p.stream)]
        inside_only = [p for p in result.outstanding if not stage.targets.get(p.stream)]
        settled = list(inside_only)  # every consumer committed them: the batch got here
        counters: dict[str, int] = {}
        if outside:
            try:
                settled += deliver_all(item.plan, stage.name, result.shard, outside)
                counters["delivered"] = len(outside)
            except ConfigurationError:
                raise
            except (MillstreamError, KafkaException) as exc:
                log.warning("shard %s: delivery failed, will retry: %s", keys.tag, exc)
                counters["delivery_failures"] = 1
        if inside_only:
            counters["handed_over"] = len(inside_only)
        if not settled:
            return counters
        assert result.lease is not None, "a shard result with outstanding productions has a lease"
        try:
            acknowledge(self.client, keys, result.lease, settled, {"acknowledged": len(settled)})
        except FencedError as exc:
            # A newer owner holds the shard: it hands over and delivers these again, and
            # consumers and sinks drop what they already have.
            log.warning("shard %s: settled, not acknowledged (%s)", keys.tag, exc)
            counters["acks_fenced"] = 1
        except MillstreamError as exc:
            log.warning("shard %s: acknowledgement failed, will retry: %s", keys.tag, exc)
            counters["ack_failures"] = 1
        else:
            counters["redelivered"] = result.redelivered
        return counters

    # --- metrics -----------------------------------------------------------------------------
    def _stage_metrics(
        self,
        stage: Stage,
        batch_id: int,
        input_wm: Watermark,
        published: Watermark,
        oldest: list[Watermark],
        results: list[ShardResult],
        busy: list[int],
    ) -> dict[str, Any]:
        """What the computation's metrics hash shows of this batch; counters under "counters"."""
        totals: dict[str, int] = {}
        for result in results:
            for name, amount in result.counters.items():
                totals[name] = totals.get(name, 0) + amount
        pending = [w.event for w in oldest if w.event < INFINITY]
        p99 = (
            min(input_wm.event, percentile_watermark(pending, 0.99)) if pending else input_wm.event
        )
        return {
            "batch_id": batch_id,
            "input_watermark": input_wm.event,
            "low_watermark": published.event,
            "p99_watermark": p99,
            "shard_tasks": len(busy),
            "round_trips": sum(r.round_trips for r in results),
            "fenced_retries": sum(r.fenced_retries for r in results),
            "shard_task_max": round(max((r.seconds for r in results), default=0.0), 4),
            "counters": totals,
        }

    def _record(
        self,
        batch_id: int,
        delivery: dict[str, dict[str, int]],
        seconds: float,
        rows: int,
        phases: dict[str, float],
    ) -> None:
        """Per computation: counters summed into its metrics hash, and the batch's figures as
        its last_batch; the batch's phases under the query's own key."""
        pipe = self.client.pipeline(transaction=False)
        for stage in self.stages.values():
            info = dict(stage.last_batch)
            counters = dict(info.pop("counters", {}))
            for name, amount in delivery.get(stage.name, {}).items():
                counters[name] = counters.get(name, 0) + amount
            for name, amount in counters.items():
                pipe.hincrby(stage.metrics_key, name, amount)
            pipe.hincrby(stage.metrics_key, "batches", 1)
            record_batch_seconds(pipe, stage.metrics_key, seconds)
            last = {**info, "seconds": round(seconds, 4), **counters}
            pipe.hset(
                stage.metrics_key,
                mapping={"last_batch": json.dumps(last), "updated_at": now_ms()},
            )
        self.last_batch = {"batch_id": batch_id, "rows": rows, "phases": phases}
        pipe.hset(
            app_key(
                self.topology.app, "fused" if self.segment == MAIN else f"fused-{self.segment}"
            ),
            mapping={"last_batch": json.dumps(self.last_batch), "updated_at": now_ms()},
        )
        pipe.execute()
        log.debug("batch %s: %s", batch_id, self.last_batch)
