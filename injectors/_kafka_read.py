"""Executor side of the Kafka injector: read exactly [start, end) of one partition into Arrow.

A replayed batch reads the same records because the range is fixed by the checkpointed
offsets: the consumer is assigned at `start` and stops at the first record at or beyond
`end - 1`, never handing out a record at `end` or later. Offsets without a record (transaction
markers, aborted records under read_committed, compacted-away records) are why the loop also
stops on a PARTITION_EOF event at or beyond `end`.

Rows are built by `_kafka_rows.py`. Consumers are cached per Python worker process (module
global): Spark reuses its Python workers between micro-batches, so a worker builds its consumer
once.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTP

from millstream.errors import ConfigurationError, TransientError
from millstream.injectors._kafka_consume import broker_error, next_events
from millstream.injectors._kafka_offsets import KafkaRange
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors._kafka_rows import Columns, RowBuilder, to_batch, to_rows

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 65_536
# Unbound C methods, for map(); typed as read here (records only: offset is never None).
_ERROR = cast("Callable[[Any], KafkaError | None]", Message.error)
CONSUME_CHUNK = 10_000
# Records a reader's consumer queues before it stops fetching. A read needs only its range,
# and what the consumer queued beyond it is dropped when the read ends: at 10,000 the driver of
# the bench's throughput process (5,000-record ranges) held 75,000 fetched records at its peak.
# At 2,000 (a fetch response of 1 MiB brings several thousand more) its peak fell from 243/252
# to 222/217 MB (fresh broker, ABBA), the summed rates of its 6 applications 339.0k -> 337.2k
# ev/s. A call never takes more than the range still needs, either.
QUEUED_RECORDS = 2_000
QUEUE_BACKOFF_MS = 10  # how soon it fetches again once its queue drained below that

# Idle consumers by configuration, kept warm between reads. A read checks one out for itself:
# the driver reads a batch's partitions at once, and two queries of one process may read at
# once, and a consumer's assignment belongs to one read.
_IDLE: dict[tuple[tuple[str, str], ...], list[Consumer]] = {}
# fetch.wait.max.ms of readers, escalated (for this process) when a fetch of records that exist
# goes unanswered: a broker may drop fetches it cannot assemble in time (see _kafka_probe).
READ_WAITS_MS = (10, 100, 500)
# How long a read at READ_WAITS_MS[i] may see nothing before escalating to [i + 1]: short for
# the cheap first step, since the batch waits meanwhile; longer for the second, as a reader
# under read_committed also sees nothing while a producer's transaction is open.
ESCALATE_AFTER_S = (1.0, 3.0)
QUIET_POLL_S = 0.25  # how often a reader that sees nothing checks its patience
_wait_level = 0
_LOCK = threading.Lock()


# A reader's fetch responses, at most (librdkafka's default is 50 MiB). Each reader reads one
# partition, and a response stays in memory while any record of it is queued. The embedded
# broker (Tansu 0.6) ignores the per-partition limit and answers with up to 5 MiB; in the
# bench's throughput process (20,000-record batches of a pre-loaded topic) a 1 MiB cap took
# the driver's peak from 287-288 MB to 247-249 MB, the process tree's from 1,375-1,377 MB to
# 1,328-1,331 (two interleaved rounds), its rates within the rounds' drift. A record batch
# larger than this still comes whole (Kafka's rule, so that a consumer makes progress).
FETCH_MAX_BYTES = 1024 * 1024


def fetch_max_bytes(kafka: Mapping[str, Any]) -> int | str:
    """`FETCH_MAX_BYTES`, or the user's `kafka.fetch.max.bytes` as given (librdkafka judges
    it); never below a `kafka.message.max.bytes` the user set (librdkafka refuses a consumer
    whose fetch.max.bytes is smaller)."""
    if "fetch.max.bytes" in kafka:
        return str(kafka["fetch.max.bytes"])
    message = str(kafka.get("message.max.bytes", ""))
    return max(FETCH_MAX_BYTES, int(message) if message.isdigit() else 0)


def _consumer(options: KafkaInjectorOptions) -> tuple[tuple[tuple[str, str], ...], Consumer]:
    """A consumer for `options`, this read's alone until `_release`d: an idle one of this
    process when there is one, else a new one."""
    config = options.client_config(
        **{
            # only waited for at a range ending in markers or gaps
            "fetch.wait.max.ms": READ_WAITS_MS[_wait_level],
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
            "fetch.max.bytes": fetch_max_bytes(options.kafka),
            "queued.max.messages.kbytes": 32 * 1024,
            # Prefetch about one consume call ahead, not librdkafka's 100,000 records: a read
            # stops at its range's end and drops the rest (a 5,000-record range fetched
            # 105,000-121,000). And once the queue is over that, librdkafka pauses the
            # consumer's fetches for fetch.queue.backoff.ms (1 s by default), a pause the
            # consumer kept into its next read: 1 s reads in about a fifth of a pre-loaded
            # topic's batches, taken for a slow broker (librdkafka debug: "Fetch backoff for
            # 1000ms: Local: Queue full"; librdkafka issue 2879).
            "queued.min.messages": QUEUED_RECORDS,
            "fetch.queue.backoff.ms": QUEUE_BACKOFF_MS,
            # Not per stream: one consumer per worker serves every topic it is handed.
            "group.id": "millstream-injector",
            "client.id": "millstream-injector",
        }
    )
    key = tuple(sorted((k, str(v)) for k, v in config.items()))
    with _LOCK:
        idle = _IDLE.get(key)
        if idle:
            return key, idle.pop()
    try:
        return key, Consumer(config)
    except KafkaException as exc:
        raise ConfigurationError(
            f"cannot create a Kafka consumer from the kafka.* options: {exc}"
        ) from None


def _release(key: tuple[tuple[str, str], ...], consumer: Consumer) -> None:
    """A read is over: its consumer waits for the next one."""
    with _LOCK:
        _IDLE.setdefault(key, []).append(consumer)


def _discard(consumer: Consumer) -> None:
    """Close a consumer after a failure, not kept: the next read starts from a clean client."""
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as exc:
        log.debug("closing a failed consumer: %s", exc)


def close_consumers() -> None:
    """Close this process's idle consumers (tests, or before deleting topics they read: a
    consumer that fetched a topic being deleted can crash inside librdkafka)."""
    with _LOCK:
        idle = [consumer for consumers in _IDLE.values() for consumer in consumers]
        _IDLE.clear()
    for consumer in idle:
        _discard(consumer)


def _level_of(key: tuple[tuple[str, str], ...]) -> int:
    """The READ_WAITS_MS index a consumer of configuration `key` was built with."""
    return READ_WAITS_MS.index(int(dict(key)["fetch.wait.max.ms"]))


def _escalate(
    options: KafkaInjectorOptions, consumer: Consumer, where: str, seen: int
) -> tuple[tuple[tuple[str, str], ...], Consumer]:
    """Replace the consumer by one with the wait after `seen`, the level this read waited at
    (kept for this process). Reads that waited at one level together escalate it once: two
    partitions' reads stalled by one broker hiccup moved a reader from 10 to 500 ms at once."""
    global _wait_level
    _discard(consumer)
    with _LOCK:
        first = _wait_level == seen  # else another read escalated it meanwhile
        if first:
            _wait_level = min(seen + 1, len(READ_WAITS_MS) - 1)
    if not first:
        return _consumer(options)
    log.warning(
        "reading %s: fetches went unanswered for %.1f s (a slow broker drops fetches it cannot "
        "assemble in time); reading with fetch.wait.max.ms=%d from now on",
        where,
        ESCALATE_AFTER_S[seen],
        READ_WAITS_MS[seen + 1],
    )
    return _consumer(options)


def read_range(options: KafkaInjectorOptions, part: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of [part.start, part.end) as Arrow batches of INJECTED_SCHEMA."""
    for cols in _read_columns(options, part):
        yield to_batch(cols, options.stream, part.topic, part.partition)


def read_range_rows(options: KafkaInjectorOptions, part: KafkaRange) -> Iterator[list[tuple]]:
    """The records of [part.start, part.end) as the row tuples the fused runtime's driver
    routes: what `read_range`'s batches hold, in INJECTED_SCHEMA's column order, without the
    trip through Arrow (the driver would turn the batches straight back into Python)."""
    for cols in _read_columns(options, part):
        yield to_rows(cols, options.stream, part.topic, part.partition)


def _read_columns(options: KafkaInjectorOptions, part: KafkaRange) -> Iterator[Columns]:
    """The records of [part.start, part.end) in chunks of at most ROWS_PER_BATCH rows."""
    if part.end <= part.start:
        return
    key, consumer = _consumer(options)
    builder = RowBuilder(options)
    servers = options.bootstrap_servers
    where = f"{part.topic}:{part.partition} [{part.start}, {part.end})"
    timeout_s = options.read_timeout_ms / 1000.0
    consumer.assign([KafkaTP(part.topic, part.partition, part.start)])
    position = part.start  # the next offset this task needs
    failed = True
    # The cyclic GC would walk every live Message object over and over (about 20% of the
    # time); this loop creates no cycles. The previous state is restored when the task ends.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        cols = Columns()
        done = False
        last_progress = time.monotonic()
        while not done:
            wanted = min(CONSUME_CHUNK, max(1, part.end - position))  # offsets >= records
            messages = next_events(consumer, wanted, QUIET_POLL_S)
            if not messages:
                quiet = time.monotonic() - last_progress
                level = _level_of(key)  # the wait this consumer fetches with
                if level < len(READ_WAITS_MS) - 1 and quiet > ESCALATE_AFTER_S[level]:
                    key, consumer = _escalate(options, consumer, where, level)
                    consumer.assign([KafkaTP(part.topic, part.partition, position)])
                    last_progress = time.monotonic()
                    continue
                if quiet > timeout_s:
                    raise TransientError(
                        f"reading {where} from {servers}: no record for {timeout_s:.0f} s "
                        "(readTimeoutMs). A transaction left open by its producer holds "
                        "read_committed readers back; otherwise check the broker."
                    )
                continue
            last_progress = time.monotonic()
            records = messages
            errors = list(map(_ERROR, messages))
            if any(errors):
                records = []
                for message, err in zip(messages, errors, strict=True):
                    if err is None:
                        records.append(message)
                    elif err.code() != KafkaError._PARTITION_EOF:
                        raise broker_error(err, f"reading {where}", servers)
                    elif message.offset() >= part.end:
                        # Everything below the partition's end came before this event.
                        done = True
                        break
            if records:
                position = max(position, records[-1].offset() + 1)
            if builder.add(cols, records, part.end):
                done = True
            if len(cols) >= ROWS_PER_BATCH or (done and len(cols)):
                yield cols
                cols = Columns()
        failed = False
    finally:
        if gc_was_enabled:
            gc.enable()
        if failed:
            _discard(consumer)
        else:
            consumer.unassign()
            _release(key, consumer)
