"""Executor side of the Kafka injector: read exactly [start, end) of one partition into Arrow.

A replayed batch reads the same records because the range is fixed by the checkpointed
offsets: the consumer is assigned at `start` and stops at the first record at or beyond
`end - 1`, never handing out a record at `end` or later. Offsets without a record (transaction
markers, aborted records under read_committed, compacted-away records) are why the loop also
stops on a PARTITION_EOF event at or beyond `end`.

Consumers are cached per Python worker process (module global): Spark reuses its Python
workers between micro-batches, so a worker builds its consumer once.
"""

from __future__ import annotations

import bisect
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTP
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from millstream.errors import ConfigurationError, TransientError
from millstream.injectors._kafka_options import Extractor, KafkaInjectorOptions, load_extractor
from millstream.injectors._kafka_probe import broker_error, next_events
from millstream.injectors.record_ids import derived_id, id_prefix
from millstream.injectors.schema import INJECTED_SCHEMA

log = logging.getLogger(__name__)

ARROW_SCHEMA = to_arrow_schema(INJECTED_SCHEMA, timezone="UTC")
HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
HEADER_STRUCT = HEADERS_TYPE.value_type
ROWS_PER_BATCH = 65_536
# Unbound C methods, for map(); typed as read here (records only: offset is never None).
_OFFSET = cast("Callable[[Any], int]", Message.offset)
_KEY = cast("Callable[[Any], bytes | None]", Message.key)
_VALUE = cast("Callable[[Any], bytes | None]", Message.value)
_TIMESTAMP = cast("Callable[[Any], tuple[int, int]]", Message.timestamp)
_HEADERS = cast("Callable[[Any], list[tuple[str, bytes | None]] | None]", Message.headers)
_ERROR = cast("Callable[[Any], KafkaError | None]", Message.error)
CONSUME_CHUNK = 10_000

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
_EXTRACTORS: dict[tuple[str, str], Extractor] = {}
_LOCK = threading.Lock()


@dataclass
class KafkaRange(InputPartition):
    """One Spark task: offsets [start, end) of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int


def _consumer(options: KafkaInjectorOptions) -> tuple[tuple[tuple[str, str], ...], Consumer]:
    """A consumer for `options`, this read's alone until `_release`d: an idle one of this
    process when there is one, else a new one."""
    config = options.client_config(
        **{
            # only waited for at a range ending in markers or gaps
            "fetch.wait.max.ms": READ_WAITS_MS[_wait_level],
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
            "queued.max.messages.kbytes": 32 * 1024,
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


def _extractor(path: str, option: str) -> Extractor:
    with _LOCK:
        func = _EXTRACTORS.get((option, path))
        if func is None:
            func = _EXTRACTORS[(option, path)] = load_extractor(path, option)
    return func


class _Columns:
    """Column buffers for one Arrow RecordBatch."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.event: list[int | None] = []
        self.system: list[int] = []
        self.ids: list[bytes] | None = None
        self.errors: list[str | None] | None = None
        self.header_ends: list[int] = [0]
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.offsets)


def _error(cols: _Columns, row: int, reason: str) -> None:
    if cols.errors is None:
        cols.errors = [None] * len(cols)
    if cols.errors[row] is None:  # keep the first reason
        cols.errors[row] = reason


def _to_batch(cols: _Columns, stream: str, topic: str, partition: int) -> pa.RecordBatch:
    n = len(cols)
    offsets = np.asarray(cols.offsets, dtype=np.int64)
    if cols.ids is None:
        # Vectorised derived ids: 8-byte partition prefix + big-endian offset.
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :8] = np.frombuffer(id_prefix(topic, partition), dtype=np.uint8)
        raw[:, 8:] = offsets.astype(">i8").view(np.uint8).reshape(n, 8)
        ids = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), n, [None, pa.py_buffer(raw.tobytes())]
        ).cast(pa.binary())
    else:
        ids = pa.array(cols.ids, pa.binary())
    header_struct = pa.StructArray.from_arrays(
        [
            pa.array(cols.header_keys, pa.string()),
            pa.array(cols.header_values, pa.binary()),
        ],
        fields=list(HEADER_STRUCT),
    )
    headers = pa.ListArray.from_arrays(
        pa.array(cols.header_ends, pa.int32()), header_struct, type=HEADERS_TYPE
    )
    arrays = [
        pa.repeat(pa.scalar(stream, pa.string()), n),
        ids,
        pa.array(cols.keys, pa.binary()),
        pa.array(cols.values, pa.binary()),
        pa.array(cols.event, pa.int64()),
        pa.array(cols.system, pa.int64()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets),
        headers,
        pa.array(cols.errors, pa.string()) if cols.errors is not None else pa.nulls(n, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _to_rows(cols: _Columns, stream: str, topic: str, partition: int) -> list[tuple]:
    """The rows `_to_batch` would hold, as tuples (headers as lists of (name, value) pairs)."""
    n = len(cols)
    if cols.ids is None:
        prefix = id_prefix(topic, partition)
        ids = [prefix + offset.to_bytes(8, "big", signed=True) for offset in cols.offsets]
    else:
        ids = cols.ids
    ends = cols.header_ends
    if ends[-1]:
        pairs = list(zip(cols.header_keys, cols.header_values, strict=True))
        headers = [pairs[ends[i] : ends[i + 1]] for i in range(n)]
    else:
        headers = [[] for _ in range(n)]
    errors = cols.errors if cols.errors is not None else [None] * n
    return list(
        zip(
            [stream] * n,
            ids,
            cols.keys,
            cols.values,
            cols.event,
            cols.system,
            [topic] * n,
            [partition] * n,
            cols.offsets,
            headers,
            errors,
            strict=True,
        )
    )


class _RowBuilder:
    """Turns librdkafka messages into column values; user extractors run here, per record."""

    def __init__(self, options: KafkaInjectorOptions) -> None:
        self._id_header = options.id_header
        self._id_extractor = (
            _extractor(options.id_extractor, "idExtractor") if options.id_extractor else None
        )
        self._ts_extractor = (
            _extractor(options.timestamp_extractor, "timestampExtractor")
            if options.timestamp_extractor
            else None
        )
        self._id_path = options.id_extractor
        self._ts_path = options.timestamp_extractor
        self._max_future_ms = options.max_future_ms
        self.custom_ids = self._id_header is not None or self._id_extractor is not None

    def add(self, cols: _Columns, messages: list[Any], end: int) -> bool:
        """Append the records below `end` (`messages`: records only, in offset order).

        True once the range is complete. Column-wise with `map` over librdkafka's C methods:
        a per-record Python loop costs about half the throughput.
        """
        if not messages:
            return False
        offsets = list(map(_OFFSET, messages))
        cut = bisect.bisect_left(offsets, end)
        if cut < len(messages):
            messages, offsets = messages[:cut], offsets[:cut]
        complete = cut < len(offsets) or bool(offsets and offsets[-1] >= end - 1)
        if not messages:
            return True
        first_row = len(cols)
        keys = list(map(_KEY, messages))
        values = list(map(_VALUE, messages))
        kinds, stamps = zip(*map(_TIMESTAMP, messages), strict=True)
        headers = list(map(_HEADERS, messages))
        cols.offsets.extend(offsets)
        cols.keys.extend(keys)
        cols.values.extend(values)
        cols.system.extend(stamps)
        if any(headers):
            h_ends, h_keys, h_values = cols.header_ends, cols.header_keys, cols.header_values
            for record_headers in headers:
                if record_headers:
                    for name, data in record_headers:
                        h_keys.append(name)
                        h_values.append(data)
                h_ends.append(len(h_keys))
        else:
            cols.header_ends.extend([cols.header_ends[-1]] * len(messages))
        if self._ts_extractor is None:
            cols.event.extend(stamps)
        else:
            cols.event.extend(
                self._event_time(cols, first_row + i, keys[i], values[i], headers[i] or [], stamp)
                for i, stamp in enumerate(stamps)
            )
        now = int(time.time() * 1000)
        bound = now + self._max_future_ms
        if 0 in kinds or min(stamps) < 0 or max(stamps) > bound:
            self._bad_timestamps(cols, first_row, kinds, stamps, now, bound)
        if self.custom_ids:
            for i, message in enumerate(messages):
                self._record_id(cols, first_row + i, message, keys[i], values[i], headers[i] or [])
        return complete

    def _bad_timestamps(
        self,
        cols: _Columns,
        first_row: int,
        kinds: tuple[int, ...],
        stamps: tuple[int, ...],
        now: int,
        bound: int,
    ) -> None:
        """Records whose Kafka timestamp is missing, negative or far ahead become error rows.

        Their system time is the read clock instead: a system time before the catalog's GC
        watermark would make the runtime drop the row as an old duplicate (a silent loss), and
        one far ahead would park its id in a catalog bucket that is never collected.
        """
        for i, (kind, stamp) in enumerate(zip(kinds, stamps, strict=True)):
            if kind == 0:  # TIMESTAMP_NOT_AVAILABLE (message format v0)
                reason = "record has no timestamp (message format v0)"
            elif stamp < 0:
                reason = f"record has no valid timestamp (Kafka timestamp {stamp})"
            elif stamp > bound:
                reason = (
                    f"record timestamp {stamp} is {stamp - now} ms ahead of the clock, more than "
                    f"maxFutureMs={self._max_future_ms} (MILLSTREAM_MAX_FUTURE_MS)"
                )
            else:
                continue
            cols.event[first_row + i] = None
            cols.system[first_row + i] = now
            _error(cols, first_row + i, reason)

    def _event_time(
        self, cols: _Columns, row: int, key: Any, value: Any, headers: list[Any], stamp: int
    ) -> int | None:
        if self._ts_extractor is None:
            return stamp
        try:
            result = self._ts_extractor(key, value, headers)
        except Exception as exc:
            _error(cols, row, f"timestampExtractor {self._ts_path} raised {exc!r}")
            return None
        if isinstance(result, bool) or not isinstance(result, int):
            _error(
                cols,
                row,
                f"timestampExtractor {self._ts_path} returned {type(result).__name__}; "
                "expected int milliseconds",
            )
            return None
        if not -(2**63) <= result < 2**63:
            _error(cols, row, f"timestampExtractor {self._ts_path} returned {result}: out of range")
            return None
        return result

    def _record_id(
        self, cols: _Columns, row: int, message: Any, key: Any, value: Any, headers: list[Any]
    ) -> None:
        if cols.ids is None:
            cols.ids = []
        if self._id_header is not None:
            found = [data for name, data in headers if name == self._id_header]
            if found and found[-1] is not None:
                cols.ids.append(found[-1])  # like Kafka's lastHeader()
                return
            if not found:
                _error(cols, row, f"record has no {self._id_header!r} header (idHeader)")
            else:
                _error(cols, row, f"header {self._id_header!r} (idHeader) is null")
            cols.ids.append(_derived_id(message))
            return
        if self._id_extractor is not None:
            try:
                result = self._id_extractor(key, value, headers)
            except Exception as exc:
                _error(cols, row, f"idExtractor {self._id_path} raised {exc!r}")
                cols.ids.append(_derived_id(message))
                return
            if isinstance(result, bytearray | memoryview):
                result = bytes(result)
            if not isinstance(result, bytes) or not result:
                _error(
                    cols,
                    row,
                    f"idExtractor {self._id_path} returned {type(result).__name__} "
                    f"{result!r:.40}; expected non-empty bytes",
                )
                cols.ids.append(_derived_id(message))
                return
            cols.ids.append(result)
            return
        cols.ids.append(_derived_id(message))


def _derived_id(message: Any) -> bytes:
    """The id of a record without one of its own (`derived_id`)."""
    return derived_id(message.topic(), message.partition(), message.offset())


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
        yield _to_batch(cols, options.stream, part.topic, part.partition)


def read_range_rows(options: KafkaInjectorOptions, part: KafkaRange) -> Iterator[list[tuple]]:
    """The records of [part.start, part.end) as the row tuples the fused runtime's driver
    routes: what `read_range`'s batches hold, in INJECTED_SCHEMA's column order, without the
    trip through Arrow (the driver would turn the batches straight back into Python)."""
    for cols in _read_columns(options, part):
        yield _to_rows(cols, options.stream, part.topic, part.partition)


def _read_columns(options: KafkaInjectorOptions, part: KafkaRange) -> Iterator[_Columns]:
    """The records of [part.start, part.end) in chunks of at most ROWS_PER_BATCH rows."""
    if part.end <= part.start:
        return
    key, consumer = _consumer(options)
    builder = _RowBuilder(options)
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
        cols = _Columns()
        done = False
        last_progress = time.monotonic()
        while not done:
            messages = next_events(consumer, CONSUME_CHUNK, QUIET_POLL_S)
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
                cols = _Columns()
        failed = False
    finally:
        if gc_was_enabled:
            gc.enable()
        if failed:
            _discard(consumer)
        else:
            consumer.unassign()
            _release(key, consumer)
