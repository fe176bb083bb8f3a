"""Photon's event-store log tier: secondary events found by id in their Kafka topics, read
around each event's time, for a join whose cache tier (`state/event_store.py`) has let them
expire.

It lives with the injectors because it is Kafka reading: the same validated source options
(`KafkaInjectorOptions`: brokers, `kafka.*` security settings, `read_committed` unless the
source says otherwise) and the same warm consumers per worker process as `_kafka_read`.

One `search` serves a whole shard batch: the wanted events' time windows are merged into
spans (`merge_spans`), each span is located once per partition of every topic, and read
forward from there. A record is kept when its id (the join's `secondary_id`) is wanted and
its Kafka timestamp lies in a window of a click that wants it, so an event is found only
around its time. Where a span starts: the broker's time index (`offsets_for_times`, one
request for every partition); a broker that answers without looking at the time (Tansu
answers the earliest offset) is caught by the first record read, stamped before the span, and
the start is then bisected over the partition's offsets, one record fetched per step. A
partition's span ends at its first record stamped after the span (or its end). The scan is
bounded per search by records and bytes; what was cut is reported, never guessed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from millstream.errors import TransientError
from millstream.injectors._kafka_consume import broker_error, next_events
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors._kafka_read import _consumer, _discard, _release

log = logging.getLogger(__name__)

Span = tuple[int, int]  # [start, end] Kafka timestamps in ms, both included
IdOf = Callable[[bytes | None, bytes], str]  # (key, value) -> event id: the join's secondary_id
QUIET_S = 10.0  # no record, no end of partition for this long: the broker is not answering
CHUNK = 1_000


SourceOptions = KafkaInjectorOptions  # a source as a search reads it (the Kafka injector's)


def source_options(options: Mapping[str, str]) -> SourceOptions:
    """A Kafka source's options (with the application's connection settings) parsed and
    checked as its injector parses them: the search reads with the injector's consumers."""
    return KafkaInjectorOptions.parse(options)


def merge_spans(windows: Sequence[Span]) -> list[Span]:
    """The union of `windows` as sorted, disjoint spans: a time read once however many clicks
    want it."""
    spans: list[Span] = []
    for start, end in sorted(windows):
        if spans and start <= spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


@dataclass
class LogSearch:
    """What one search found (event id -> value, the first in topic, partition, offset order)
    and what it cost."""

    found: dict[str, bytes] = field(default_factory=dict)
    scanned: int = 0  # records read
    bytes: int = 0  # their keys and values
    reads: int = 0  # (partition, span) ranges read
    probes: int = 0  # single-record fetches to bisect a start
    truncated: bool = False  # the bound stopped the scan before every span was read

    def describe(self) -> str:
        cut = ", cut at the bound" if self.truncated else ""
        return (
            f"{self.scanned} records ({self.bytes} bytes) in {self.reads} ranges, "
            f"{self.probes} bisect probes, {len(self.found)} found{cut}"
        )


class _Budget:
    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.records, self.bytes = max_records, max_bytes

    def spent(self) -> bool:
        return self.records <= 0 or self.bytes <= 0


def search(
    sources: Sequence[KafkaInjectorOptions],
    id_of: IdOf,
    wants: Mapping[str, Sequence[Span]],
    *,
    max_records: int,
    max_bytes: int,
) -> LogSearch:
    """Find each wanted event id in the topics of `sources`, stamped inside one of its windows.

    `wants`: event id -> the windows (one per click that wants it). Read-only: calling it again
    reads again (a re-run may find more, as the cache tier may). Broker failures raise
    `TransientError` or `ConfigurationError` (`broker_error`)."""
    result = LogSearch()
    if not wants:
        return result
    spans = merge_spans([w for windows in wants.values() for w in windows])
    budget = _Budget(max_records, max_bytes)
    for options in sources:
        key, consumer = _consumer(options)
        failed = True
        try:
            for topic in options.topics:
                _search_topic(consumer, options, topic, spans, id_of, wants, budget, result)
            failed = False
        finally:
            if failed:
                _discard(consumer)
            else:
                consumer.unassign()
                _release(key, consumer)
    return result


def _search_topic(
    consumer: Consumer,
    options: KafkaInjectorOptions,
    topic: str,
    spans: list[Span],
    id_of: IdOf,
    wants: Mapping[str, Sequence[Span]],
    budget: _Budget,
    result: LogSearch,
) -> None:
    where = f"event log {topic}"
    timeout = options.read_timeout_ms / 1000.0
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
    except KafkaException as exc:
        raise broker_error(exc.args[0], where, options.bootstrap_servers) from None
    if meta.error is not None:
        raise broker_error(meta.error, where, options.bootstrap_servers)
    partitions = sorted(meta.partitions)
    for start, end in spans:
        try:
            located = consumer.offsets_for_times(
                [KafkaTP(topic, p, start) for p in partitions], timeout=timeout
            )
        except KafkaException as exc:
            raise broker_error(exc.args[0], where, options.bootstrap_servers) from None
        for tp in located:
            if budget.spent():
                result.truncated = True
                return
            if tp.error is not None:
                raise broker_error(tp.error, where, options.bootstrap_servers)
            if tp.offset < 0:
                continue  # no record stamped at or after the span's start
            span_where = f"{where}:{tp.partition} from {start}"
            _read_span(consumer, options, tp, (start, end), id_of, wants, budget, result,
                       span_where)  # fmt: skip


def _read_span(
    consumer: Consumer,
    options: KafkaInjectorOptions,
    tp: KafkaTP,
    span: Span,
    id_of: IdOf,
    wants: Mapping[str, Sequence[Span]],
    budget: _Budget,
    result: LogSearch,
    where: str,
) -> None:
    """Read one partition forward from the broker's start for `span` to its end. Its first
    record checks the broker's answer: stamped before the span, the start is bisected."""
    start, end = span
    result.reads += 1
    consumer.assign([KafkaTP(tp.topic, tp.partition, tp.offset)])
    checked = False
    quiet_since = time.monotonic()
    while True:
        messages = next_events(consumer, CHUNK, 0.2)
        if not messages:
            if time.monotonic() - quiet_since > QUIET_S:
                raise TransientError(f"{where}: no record and no partition end for {QUIET_S} s")
            continue
        quiet_since = time.monotonic()
        for message in messages:
            err = message.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return
                raise broker_error(err, where, options.bootstrap_servers)
            stamp = message.timestamp()[1]
            if not checked:
                checked = True
                if stamp < start:  # the broker did not look the time up
                    low = int(message.offset() or 0)
                    offset = _bisect(consumer, options, tp, start, low, where, result)
                    consumer.assign([KafkaTP(tp.topic, tp.partition, offset)])
                    break  # read again from there
            if stamp > end:
                return  # the partition is past the span
            key, value = message.key(), message.value() or b""
            result.scanned += 1
            size = len(key or b"") + len(value)
            result.bytes += size
            budget.records -= 1
            budget.bytes -= size
            if stamp >= start:
                _match(key, value, stamp, id_of, wants, result)
            if budget.spent():
                result.truncated = True
                return


def _match(
    key: bytes | None,
    value: bytes,
    stamp: int,
    id_of: IdOf,
    wants: Mapping[str, Sequence[Span]],
    result: LogSearch,
) -> None:
    try:
        event = id_of(key, value)
    except Exception:  # not an event this join can name: the store computation dead-letters it
        return
    windows = wants.get(event)
    if windows is None or event in result.found:
        return
    if any(lo <= stamp <= hi for lo, hi in windows):
        result.found[event] = value


def _first_at(
    consumer: Consumer,
    options: KafkaInjectorOptions,
    topic: str,
    partition: int,
    offset: int,
    where: str,
) -> tuple[int, int] | None:
    """(offset, Kafka timestamp) of the first record at or after `offset`; None at the end."""
    consumer.assign([KafkaTP(topic, partition, offset)])
    quiet_since = time.monotonic()
    while True:
        message = consumer.poll(0.2)
        if message is None:
            if time.monotonic() - quiet_since > QUIET_S:
                raise TransientError(f"{where}: no record and no partition end for {QUIET_S} s")
            continue
        err = message.error()
        if err is None:
            return int(message.offset() or 0), message.timestamp()[1]
        if err.code() == KafkaError._PARTITION_EOF:
            return None
        raise broker_error(err, where, options.bootstrap_servers)


def _bisect(
    consumer: Consumer,
    options: KafkaInjectorOptions,
    tp: KafkaTP,
    start: int,
    low: int,
    where: str,
    result: LogSearch,
) -> int:
    """The first offset whose record is stamped at or after `start`, by bisection over
    [low, the partition's end): for a broker whose time index answers without the time.
    Timestamps out of order (CreateTime from many producers) make it approximate, as the
    broker's own index is."""
    topic, partition = tp.topic, tp.partition
    try:
        # The fetch that brought the record at `low` also brought the partition's end: the
        # cached answer is that one (Tansu's ListOffsets answer can lag behind it).
        high = consumer.get_watermark_offsets(KafkaTP(topic, partition), cached=True)[1]
        if high <= low:
            _, high = consumer.get_watermark_offsets(
                KafkaTP(topic, partition), timeout=options.read_timeout_ms / 1000.0
            )
    except KafkaException as exc:
        raise broker_error(exc.args[0], where, options.bootstrap_servers) from None
    lo, hi = low + 1, max(high, low + 1)  # the record at `low` is stamped before `start`
    while lo < hi:
        mid = (lo + hi) // 2
        result.probes += 1
        first = _first_at(consumer, options, topic, partition, mid, where)
        if first is None or first[1] >= start:
            hi = mid
        else:
            lo = first[0] + 1
    return lo


def describe_sources(sources: Sequence[KafkaInjectorOptions]) -> str:
    """The topics a search reads, for log lines."""
    return ",".join(t for options in sources for t in options.topics)
