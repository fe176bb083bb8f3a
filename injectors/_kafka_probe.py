"""Driver side of the Kafka injector: partitions, end offsets and the next record, by fetching.

How end offsets are learned, and why:

* Not from ListOffsets "latest" (`get_watermark_offsets(cached=False)`, `OFFSET_END`) nor
  `offsets_for_times`: a broker may answer them wrongly (the embedded one does, see the README's
  section on its defects), and an injector built on a short end offset stalls.
* A Fetch response carries the partition's high watermark. So a probe assigns a consumer at a
  chosen offset and waits for the first event of each partition: a record (the first one at or
  after the offset) or a PARTITION_EOF event (the offset is the end). librdkafka stores the
  response's high watermark before it enqueues the records, so
  `get_watermark_offsets(tp, cached=True)` read after that event belongs to this fetch. One
  probe is one fetch round trip.
* `fetch.wait.max.ms` starts at 25 ms. On Apache Kafka the wait costs nothing while records
  arrive (a fetch is answered once any partition it names has one), so only a probe of quiet
  partitions waits it out. The embedded broker drops 1 ms fetches under live traffic, and the
  escalation's stall was the record p99 of its pipelines (README, broker defects). A broker may
  never answer a fetch it cannot assemble within the wait, so when a fetch goes unanswered for
  ESCALATE_AFTER_S the probe rebuilds its consumer with the next longer wait in FETCH_WAITS_MS
  and keeps it. That wait (ms) is remembered in the application's Redis (hash
  `ms:{app}:probe-wait`, field = bootstrap servers), so a restart does not stall again to learn
  the same broker's manner; any other value (an index, as stored before 2026-12-07) is unknown.
* Over a backlog, what looked like dropped fetches was librdkafka's own pause: past
  `queued.min.messages` queued records (100,000 by default) it stops fetching for
  `fetch.queue.backoff.ms` (1 s by default), and a reused consumer keeps that pause into its
  next assignment; probes of a pre-loaded topic took 1.0-1.7 s and escalated to 250 ms. So the
  probe queues at most PROBE_QUEUE records and pauses QUEUE_BACKOFF_MS, and levels remembered
  under the key's old name (`:kafka-probe`) are not read. The fetches the embedded broker still
  leaves unanswered under live traffic are in the README's section on its defects.
* The probe reads `read_uncommitted` on purpose: under `read_committed` a fetch beyond the last
  stable offset returns neither records nor EOF while a transaction is open. On Apache Kafka the
  high watermark can therefore lie beyond the last stable offset; executors reading
  `read_committed` then wait for that transaction to end, as every read_committed consumer
  does, and skip aborted records and markers (see `_kafka_read`).
* A caught-up partition's estimate also uses its last record below the batch's end offset
  (see `watermark`). The planner's probe of the high watermarks reads what its fetches queued
  (`drain`), so it usually brings that record (`Peek.last`); when it stopped short of its high
  watermark below its byte limit, the planner ends the batch just after the newest record it
  brought, as a lagging partition (`_kafka_plan._cut`); otherwise `last_records` fetches
  LOOKBACK offsets before the end and reads up to the end. Why the last record is right on
  Apache Kafka, not only here: the end offset of a caught-up partition is a high watermark a
  Fetch reported; a Kafka consumer is never handed a record
  above the high watermark, and the offsets below it are committed to every in-sync replica
  and never rewritten (an append-only log; a new leader keeps them). So the records this
  fetch sees below the end are the ones the batch's readers see (under `read_committed`, less
  aborted ones, see `last_records`), and records written later land at or beyond the end:
  the value depends on the end offset alone, not on when it is probed. Only retention,
  compaction or DeleteRecords can remove offsets below the end; then fewer records are seen
  and the estimate falls back to the idle bound, never above what the data implied. The
  planner computes it once per batch; Spark stores it in the offset log with the end offsets
  ("wm"), and a re-run batch takes it from there.
* The probe consumer is built once per reader (the planner process lives as long as the query)
  and unassigned after each probe, so it does not keep fetching between triggers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from millstream.errors import ConfigurationError, TransientError
from millstream.injectors._kafka_consume import broker_error, next_events
from millstream.injectors._kafka_offsets import TopicPartition, tp_key
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.state.client import connect
from millstream.state.keys import app_key

log = logging.getLogger(__name__)

EARLIEST = OFFSET_BEGINNING  # a logical offset: "the first record" (ListOffsets earliest)
METADATA_REFRESH_S = 30.0
PROBE_TIMEOUT_S = 30.0
FETCH_WAITS_MS = (25, 250)  # fetch.wait.max.ms of the probe, escalated when unanswered
# How long a fetch at FETCH_WAITS_MS[i] may go unanswered before escalating to [i + 1]. A
# fetch is answered within its wait plus 1-5 ms on loopback, so even a loaded machine rarely
# escalates wrongly.
ESCALATE_AFTER_S = (2.0,)
# Offsets before an end offset searched for its last record: the last offsets of a partition
# written by transactional producers are commit markers (one per transaction and producer).
LOOKBACK = 16
_wait_level = 0  # index into FETCH_WAITS_MS, for every probe of this process from then on
PROBE_QUEUE = 1000  # records a probe's consumer queues before it stops fetching
# Bytes a probe's fetch may bring per partition. The records since the last probe are what a
# caught-up partition's estimate needs the last of; at 5,000 events/s and 1.5 s triggers they
# are 2,000 records a partition, and a 64 KiB fetch held the last in none of 21 probes here,
# so each needed `last_records`' second fetch. librdkafka's default, 1 MiB, holds them.
PROBE_FETCH_BYTES = 1024 * 1024
# Records a draining probe reads from what its fetches queued, looking for the one below the
# high watermark; past that, the newest one read so far stands.
PROBE_DRAIN = 20_000
# A probe that brought this share of its byte limit (keys, values and headers; the record
# framing is not counted) stopped at the limit: a backlog, not a fetch short of its end.
FULL_SHARE = 4
QUEUE_BACKOFF_MS = 10  # how soon it fetches again once its queue drained below that

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Peek:
    """What one fetch told about a partition at a probed offset."""

    high: int  # high watermark: the offset after the last record
    offset: int | None  # first record at or after the probed offset; None: nothing there
    timestamp: int | None = None  # that record's Kafka timestamp (ms), None if it has none
    key: bytes | None = None
    value: bytes | None = None
    headers: Headers | None = None
    # The newest record below `high` among the messages `probe` read, maybe this one (a
    # draining probe reads on towards `high`): the record below `high` without
    # `last_records`' second round trip, or, short of it, where the planner may end a
    # caught-up partition's batch.
    last: Peek | None = None
    # The fetch brought about its byte limit from here to `last` (`probe` only): it stopped
    # for a backlog, not short of `high` (`FULL_SHARE`).
    full: bool = False


class PartitionProbe:
    """Fetch-based partition metadata, high watermarks and peeks, for one query's planner."""

    def __init__(self, options: KafkaInjectorOptions) -> None:
        global _wait_level
        self._options = options
        _wait_level = max(_wait_level, self._remembered_level())
        self._consumer: Consumer | None = None
        self._partitions: list[TopicPartition] = []
        self._listed_at = -METADATA_REFRESH_S

    def _remembered_level(self) -> int:
        """The fetch wait this application's probes escalated to on this broker; 0 unknown."""
        if not self._options.redis_url:
            return 0
        try:
            raw = connect(self._options.redis_url).hget(
                app_key(self._options.app, "probe-wait"), self._options.bootstrap_servers
            )
            wait = int(raw or 0)
        except (redis.RedisError, ValueError):
            return 0  # unknown: learn it again
        return FETCH_WAITS_MS.index(wait) if wait in FETCH_WAITS_MS else 0

    def _remember_level(self) -> None:
        if not self._options.redis_url:
            return
        try:
            connect(self._options.redis_url).hset(
                app_key(self._options.app, "probe-wait"),
                self._options.bootstrap_servers,
                FETCH_WAITS_MS[_wait_level],
            )
        except redis.RedisError as exc:  # only a restart's first probes pay for it
            log.warning("injector %s: fetch wait not remembered: %s", self._options.stream, exc)

    def _client(self) -> Consumer:
        if self._consumer is None:
            config = self._options.client_config(
                **{
                    "isolation.level": "read_uncommitted",
                    "fetch.wait.max.ms": FETCH_WAITS_MS[_wait_level],
                    "max.partition.fetch.bytes": PROBE_FETCH_BYTES,
                    # A probe needs one event per partition; see the module docstring.
                    "queued.min.messages": PROBE_QUEUE,
                    "fetch.queue.backoff.ms": QUEUE_BACKOFF_MS,
                    "client.id": f"millstream-injector-probe-{self._options.stream}",
                }
            )
            try:
                self._consumer = Consumer(config)
            except KafkaException as exc:
                raise ConfigurationError(
                    f"cannot create a Kafka consumer from the kafka.* options: {exc}"
                ) from None
        return self._consumer

    def partitions(self) -> list[TopicPartition]:
        """Every partition of the input topics; re-read from metadata every 30 s."""
        now = time.monotonic()
        if now - self._listed_at < METADATA_REFRESH_S and self._partitions:
            return self._partitions
        servers = self._options.bootstrap_servers
        found: list[TopicPartition] = []
        for topic in self._options.topics:
            try:
                meta = self._client().list_topics(topic, timeout=PROBE_TIMEOUT_S).topics.get(topic)
            except KafkaException as exc:
                raise broker_error(exc.args[0], f"metadata of topic {topic!r}", servers) from None
            if meta is None or meta.error is not None:
                err = meta.error if meta is not None else None
                if err is not None and err.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise broker_error(err, f"metadata of topic {topic!r}", servers)
                raise ConfigurationError(
                    f"input topic {topic!r} does not exist on {servers}: create it first "
                    "(millstream never creates input topics), or fix the topics option."
                )
            found.extend((topic, p) for p in sorted(meta.partitions))
        self._partitions = found
        self._listed_at = now
        return found

    def probe(
        self, at: Mapping[TopicPartition, int], *, drain: bool = False
    ) -> dict[TopicPartition, Peek]:
        """Fetch once at each given offset (or EARLIEST); one round trip for all partitions.
        With `drain`, also read what the fetches queued already, for `Peek.last` and
        `Peek.full` (the planner's probe of the high watermarks: see `_fetch_once`)."""
        if not at:
            return {}
        seen = self._answered(at, lambda deadline: self._fetch_once(at, deadline, drain))
        out: dict[TopicPartition, Peek] = {}
        for tp, (message, high, last, brought) in seen.items():
            peek = self._peek(tp, (message, high))
            if last is not None and peek.offset is not None and peek.high == high:
                full = brought >= PROBE_FETCH_BYTES // FULL_SHARE
                peek = replace(peek, last=self._peek(tp, (last, high)), full=full)
            out[tp] = peek
        return out

    def last_records(self, ends: Mapping[TopicPartition, int]) -> dict[TopicPartition, Peek]:
        """The last record below each end offset: a `Peek` whose `offset` is that record's, or
        None when the LOOKBACK offsets before the end hold no record (markers only, an empty
        partition, or records deleted by retention). One round trip for all partitions when
        the records are small.

        Read `read_uncommitted` like every probe, so the record may belong to a transaction
        still open (readers under `read_committed` wait for it) or aborted (readers skip it).
        Either way a producer wrote it, and what producers write next may be older than it
        only by the stream's out-of-order bound: a producer that aborts and re-sends old
        records later than that breaks the bound as a slow producer does, and its records are
        late (counted, then handled by the computation's `late` option).
        """
        at = {tp: max(0, end - LOOKBACK) for tp, end in ends.items() if end > 0}
        out = {tp: Peek(high=end, offset=None) for tp, end in ends.items() if end <= 0}
        if not at:
            return out
        seen = self._answered(at, lambda deadline: self._fetch_last(at, ends, deadline))
        for tp, found in seen.items():
            message, high = found
            out[tp] = Peek(high=high, offset=None) if message is None else self._peek(tp, found)
        return out

    def _answered(
        self, at: Mapping[TopicPartition, int], fetch: Callable[[float], dict[TopicPartition, Any]]
    ) -> dict[TopicPartition, Any]:
        """`fetch(deadline)` until it answers for every partition of `at`, escalating the
        fetch wait (see the module docstring) when a broker leaves fetches unanswered."""
        global _wait_level
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while True:
            last = _wait_level == len(FETCH_WAITS_MS) - 1
            patience = deadline if last else time.monotonic() + ESCALATE_AFTER_S[_wait_level]
            seen = fetch(min(patience, deadline))
            if len(seen) == len(at):
                return seen
            if last or time.monotonic() >= deadline:
                missing = ", ".join(tp_key(tp) for tp in at if tp not in seen)
                raise TransientError(
                    f"Kafka at {self._options.bootstrap_servers} sent no fetch response for "
                    f"{missing} within {PROBE_TIMEOUT_S:.0f} s; is the broker up and the "
                    "partition led?"
                )
            _wait_level += 1
            log.warning(
                "injector %s: a %d ms fetch went unanswered for %.1f s (a slow broker drops "
                "such fetches); probing with fetch.wait.max.ms=%d from now on",
                self._options.stream,
                FETCH_WAITS_MS[_wait_level - 1],
                ESCALATE_AFTER_S[_wait_level - 1],
                FETCH_WAITS_MS[_wait_level],
            )
            self._remember_level()
            self.close()  # the next _client() uses the longer wait

    def _fetch_once(
        self, at: Mapping[TopicPartition, int], deadline: float, drain: bool
    ) -> dict[TopicPartition, tuple[Any, int, Any, int]]:
        """The first event of each partition (record or EOF) seen before `deadline`, the high
        watermark of the fetch that brought it, the newest record below that high watermark
        among the messages read (None if the first event was EOF), and the bytes of keys,
        values and headers from the first record to it.

        With `drain`, what the fetches queued already is read too, until each partition's
        records reach the high watermark or its byte limit (`FULL_SHARE`): a caught-up
        partition's estimate needs its last record below the batch's end (see
        `last_records`), and the planner ends the batch after the newest record read here
        when they did not reach it (`_kafka_plan._cut`), so a trigger needs no second round
        trip, which on the embedded broker cost 145-195 ms (p50) on top of the probe's, and up
        to 0.5 s under load.
        """
        consumer = self._client()
        servers = self._options.bootstrap_servers
        consumer.assign([KafkaTP(t, p, offset) for (t, p), offset in at.items()])
        seen: dict[TopicPartition, tuple[Any, int]] = {}
        newest: dict[TopicPartition, Any] = {}
        brought: dict[TopicPartition, int] = {}

        def keep(tp: TopicPartition, message: Any) -> None:
            newest[tp] = message
            size = len(message.key() or b"") + len(message.value() or b"")
            for name, value in message.headers() or ():
                size += len(name) + len(value or b"")
            brought[tp] = brought.get(tp, 0) + size

        def take(messages: list[Any]) -> None:
            for message in messages:
                tp = (message.topic(), message.partition())
                if tp not in at:
                    continue
                first = seen.get(tp)
                if first is not None:
                    # A partition's records come in offset order; later fetches' ones (at
                    # or beyond this fetch's high watermark) are not this probe's.
                    if message.error() is None and message.offset() < first[1]:
                        keep(tp, message)
                    continue
                err = message.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise broker_error(err, f"probing {tp_key(tp)}", servers)
                # librdkafka stores a response's high watermark before it enqueues its
                # records: read now, it is the one of the fetch that brought this event.
                high = consumer.get_watermark_offsets(KafkaTP(*tp), cached=True)[1]
                seen[tp] = (message, high)
                if err is None and message.offset() < high:
                    keep(tp, message)

        def short() -> bool:
            """Some partition's records so far end below its fetch's high watermark, and not
            at the fetch's byte limit (then the rest is a backlog, not worth reading here)."""
            full = PROBE_FETCH_BYTES // FULL_SHARE
            for tp, (message, high) in seen.items():
                last = newest.get(tp, message)
                if last.error() is None and last.offset() < high - 1 and brought.get(tp, 0) < full:
                    return True
            return False

        try:
            while len(seen) < len(at):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                take(next_events(consumer, 1000, min(remaining, 1.0)))
            drained = 0  # what the fetches queued already, read without waiting
            while drain and len(seen) == len(at) and drained < PROBE_DRAIN and short():
                queued = consumer.consume(1000, timeout=0)
                if not queued:
                    break
                drained += len(queued)
                take(queued)
            return {
                tp: (message, high, newest.get(tp), brought.get(tp, 0))
                for tp, (message, high) in seen.items()
            }
        finally:
            consumer.unassign()

    def _fetch_last(
        self, at: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int], deadline: float
    ) -> dict[TopicPartition, tuple[Any, int]]:
        """Per partition, the last record below its end offset (None if none) read from `at`,
        with the high watermark, for the partitions done before `deadline`: done at the record
        at `end - 1`, at a record beyond it, or at the partition's end (PARTITION_EOF)."""
        consumer = self._client()
        servers = self._options.bootstrap_servers
        consumer.assign([KafkaTP(t, p, offset) for (t, p), offset in at.items()])
        last: dict[TopicPartition, Any] = {}
        done: set[TopicPartition] = set()
        try:
            while len(done) < len(at):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for message in next_events(consumer, 1000, min(remaining, 1.0)):
                    tp = (message.topic(), message.partition())
                    if tp not in at or tp in done:
                        continue
                    err = message.error()
                    if err is not None:
                        code = err.code()
                        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            # Retention deleted the offsets looked at: nothing known (the idle
                            # bound alone), not the data loss a reader reports.
                            last.pop(tp, None)
                        elif code != KafkaError._PARTITION_EOF:
                            raise broker_error(err, f"probing {tp_key(tp)}", servers)
                        done.add(tp)
                        continue
                    offset = message.offset()
                    if offset < ends[tp]:
                        last[tp] = message
                    if offset >= ends[tp] - 1:
                        done.add(tp)
            return {
                tp: (last.get(tp), consumer.get_watermark_offsets(KafkaTP(*tp), cached=True)[1])
                for tp in done
            }
        finally:
            consumer.unassign()

    def _peek(self, tp: TopicPartition, seen: tuple[Any, int]) -> Peek:
        message, high = seen
        if message.error() is not None:  # PARTITION_EOF: the offset is the fetch position = end
            return Peek(high=max(high, message.offset()), offset=None)
        offset = message.offset()
        kind, stamp = message.timestamp()
        return Peek(
            high=max(high, offset + 1),
            offset=offset,
            timestamp=stamp if kind != 0 else None,
            key=message.key(),
            value=message.value(),
            headers=message.headers() or [],
        )

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing the probe consumer: %s", exc)
