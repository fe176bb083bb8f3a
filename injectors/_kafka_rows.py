"""The Kafka injector's rows: a partition's records as the injected schema's columns.

`RowBuilder` turns consumed messages into columns (key, value, event and system time, headers,
record ids), making error rows instead of dropping bad input (a timestamp missing or far ahead,
an extractor that raised); `to_batch` and `to_rows` give them to Spark (Arrow) or to the fused
runtime's driver (row tuples). The reading itself, consumers and their waits, is
`_kafka_read.py`.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pyarrow as pa
from confluent_kafka import Message
from pyspark.sql.pandas.types import to_arrow_schema

from millstream.injectors._kafka_options import Extractor, KafkaInjectorOptions, load_extractor
from millstream.injectors.record_ids import derived_id, id_prefix
from millstream.injectors.schema import INJECTED_SCHEMA

ARROW_SCHEMA = to_arrow_schema(INJECTED_SCHEMA, timezone="UTC")
HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
HEADER_STRUCT = HEADERS_TYPE.value_type
# Unbound C methods, for map(); typed as read here (records only: offset is never None).
_OFFSET = cast("Callable[[Any], int]", Message.offset)
_KEY = cast("Callable[[Any], bytes | None]", Message.key)
_VALUE = cast("Callable[[Any], bytes | None]", Message.value)
_TIMESTAMP = cast("Callable[[Any], tuple[int, int]]", Message.timestamp)
_HEADERS = cast("Callable[[Any], list[tuple[str, bytes | None]] | None]", Message.headers)
_EXTRACTORS: dict[tuple[str, str], Extractor] = {}
_LOCK = threading.Lock()


def _extractor(path: str, option: str) -> Extractor:
    with _LOCK:
        func = _EXTRACTORS.get((option, path))
        if func is None:
            func = _EXTRACTORS[(option, path)] = load_extractor(path, option)
    return func


class Columns:
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


def _error(cols: Columns, row: int, reason: str) -> None:
    if cols.errors is None:
        cols.errors = [None] * len(cols)
    if cols.errors[row] is None:  # keep the first reason
        cols.errors[row] = reason


def to_batch(cols: Columns, stream: str, topic: str, partition: int) -> pa.RecordBatch:
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


def to_rows(cols: Columns, stream: str, topic: str, partition: int) -> list[tuple]:
    """The rows `to_batch` would hold, as tuples (headers as lists of (name, value) pairs)."""
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


class RowBuilder:
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

    def add(self, cols: Columns, messages: list[Any], end: int) -> bool:
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
        cols: Columns,
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
        self, cols: Columns, row: int, key: Any, value: Any, headers: list[Any], stamp: int
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
        self, cols: Columns, row: int, message: Any, key: Any, value: Any, headers: list[Any]
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
