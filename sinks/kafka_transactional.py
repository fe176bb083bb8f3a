"""Exactly-once Kafka output for external `read_committed` consumers.

One transactional producer per shard, `transactional.id = millstream.{app}.{computation}.{shard}`:
initialising it makes Kafka abort the shard's previous open transaction and fence every older
producer with that id (a zombie task, a crashed worker that comes back).

Progress lives in Kafka, in the same transaction as the records: a transactional offset commit
(`send_offsets_to_transaction`) for the consumer group `millstream.progress.{app}.{computation}.
{shard}.{stream}` on partition 0 of the progress topic, with offset = highest delivered seq + 1.
The group coordinator applies it only if the transaction commits, and `Consumer.committed()`
with `isolation.level=read_committed` never returns a pending or aborted one. On every
(re)initialisation the sink reads that progress, skips productions with seq <= progress and
delivers the rest plus the new progress in one transaction; so each production becomes
visible to a read_committed consumer exactly once, whatever crashed where. A commit that times
out (broker gone mid-commit) may still commit: that producer is kept and its commit resumed on
the shard's next delivery, never aborted (`millstream.sinks._shard_producer`); a broker whose
progress offsets then contradict librdkafka's success is named in the log (`_confirm`).

Caveats: Kafka expires the committed offsets of a group without members after
`offsets.retention.minutes` (7 days by default); progress matters only for checkpoints left
behind by a crash between commit and checkpoint deletion, so keep that retention longer than
any outage you recover from.

Why offsets rather than a progress record in a compacted topic: reading such a record back needs
read_committed semantics over a whole partition, which stalls behind any other shard's open
transaction (and which a broker that serves aborted records gets wrong); an offset fetch is one
small request with the same meaning everywhere. The embedded broker's defects that bear on this
sink are listed in the README ("Known broker defects of the embedded broker").
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Self

from confluent_kafka import (
    KafkaError,
    Message,
    TopicPartition,
)

from millstream.errors import ConfigurationError, MillstreamError, TransientError
from millstream.fault_points import fault_point
from millstream.kafka_admin import check_topics
from millstream.kafka_errors import classify
from millstream.records import Production
from millstream.sinks._kafka import (
    Deadline,
    TopicFor,
    resolve_topic,
    static_topics,
    topic_mapping,
)
from millstream.sinks._kafka_progress import (
    NO_PROGRESS as _NO_PROGRESS,
)
from millstream.sinks._kafka_progress import (
    PROGRESS_PARTITION as _PROGRESS_PARTITION,
)
from millstream.sinks._kafka_progress import (
    confirm_resumed_commit,
    ensure_progress_topic,
    fetch_progress,
    probe_transactions,
)
from millstream.sinks._kafka_progress import progress_group as progress_group
from millstream.sinks._kafka_settings import KafkaSettings
from millstream.sinks._produce import produce
from millstream.sinks._shard_producer import (
    RETRY_PAUSE_S,
    Abortable,
    Fenced,
    ShardProducer,
    ShardProducers,
    init_shard_producer,
)
from millstream.sinks.base import (
    SKIPPED_DELIVERED,
    Delivery,
    DeliveryReport,
    ShardRef,
    Sink,
)

log = logging.getLogger(__name__)

PROGRESS_TOPIC = "__millstream_progress"


def transactional_id(shard: ShardRef) -> str:
    """Deterministic per shard, so a new owner's init_transactions fences the old one."""
    return f"millstream.{shard.app}.{shard.computation}.{shard.shard}"


_SHARDS = ShardProducers()
_SETUP_DONE: set[tuple[Any, ...]] = set()
_SETUP_LOCK = threading.Lock()


class KafkaTransactionalSink(Sink):
    """Exactly-once delivery to Kafka topics read by `isolation.level=read_committed` consumers.

    `KafkaTransactionalSink(topic="out")` takes the Kafka settings of the application that runs
    it (see `bind`); `KafkaTransactionalSink(kafka_config, "out")` uses `kafka_config`.
    `topic_for` instead of `topic` maps a production's stream to a topic (a name, a dict or a
    function). Output topics must exist; the progress topic is created (one partition,
    compacted) when missing. Records are laid out as by `KafkaStreamSink`. `deliver` commits one
    transaction per call and returns once it is committed; it raises FencedError when a newer
    producer for the shard took over during the call, TransientError when Kafka did not commit
    within `delivery_timeout_s`, and never leaves a transaction open.
    """

    keeps_shard_producers = True

    def __init__(
        self,
        kafka_config: Mapping[str, str] | None = None,
        topic_for: TopicFor | None = None,
        *,
        topic: str | None = None,
        progress_topic: str = PROGRESS_TOPIC,
        delivery_timeout_s: float = 30.0,
        transaction_timeout_ms: int = 60_000,
        producer_config: Mapping[str, Any] | None = None,
        max_cached_producers: int = 64,
        metadata_timeout_s: float = 10.0,
    ) -> None:
        if delivery_timeout_s <= 0 or delivery_timeout_s * 1000 > transaction_timeout_ms:
            raise ConfigurationError(
                f"delivery_timeout_s={delivery_timeout_s} must be positive and at most "
                f"transaction_timeout_ms={transaction_timeout_ms} / 1000: a delivery that outlives "
                "its transaction would be aborted by the broker"
            )
        if max_cached_producers < 1:
            raise ConfigurationError("max_cached_producers must be at least 1")
        self._progress_topic = progress_topic
        self._timeout = float(delivery_timeout_s)
        self._txn_timeout_s = transaction_timeout_ms / 1000
        self._metadata_timeout = float(metadata_timeout_s)
        self._cap = max_cached_producers
        self._txn_ids: set[str] = set()  # the shards' producers this sink delivered with
        self._kafka = KafkaSettings(
            type(self).__name__,
            kafka_config,
            producer_config,
            {
                "enable.idempotence": True,
                "acks": "all",
                "allow.auto.create.topics": False,
                "transaction.timeout.ms": int(transaction_timeout_ms),
                "message.timeout.ms": int(self._timeout * 1000),
                "partitioner": (producer_config or {}).get("partitioner", "murmur2_random"),
                "linger.ms": (producer_config or {}).get("linger.ms", 5),
            },
        )
        # Checked after the settings, so that KafkaTransactionalSink("out") hears that "out"
        # went where the settings go.
        self._topic_for = topic_mapping(type(self).__name__, topic_for, topic)
        self._checked: set[str] = set()

    # ------------------------------------------------------------------------------ lifecycle
    def bind(self, kafka_config: Mapping[str, str]) -> Self:
        if self._kafka.bound:
            return self
        bound = copy.copy(self)
        bound._kafka = self._kafka.bind(kafka_config)
        bound._checked = set()  # topics checked on that cluster, not shared with this unbound one
        bound._txn_ids = set()
        return bound

    def setup(self) -> None:
        """Fail fast on: missing output topics, no progress topic, transactions unavailable."""
        # Once per process for this configuration and these topics: another sink with the same
        # Kafka settings but other output topics must still have its topics checked.
        topics = static_topics(self._topic_for)
        done = (os.getpid(), self._kafka.cache_key, self._progress_topic, *topics)
        with _SETUP_LOCK:
            if done in _SETUP_DONE:
                return
        check_topics(self._kafka.connection, topics, self._metadata_timeout)
        self._checked.update(topics)
        self._ensure_progress_topic()
        self._probe_transactions()
        with _SETUP_LOCK:
            _SETUP_DONE.add(done)

    def deliver(self, shard: ShardRef, productions: Sequence[Production]) -> DeliveryReport:
        if not productions:
            return DeliveryReport(shard)
        self.setup()  # once per process: progress must never go to a missing topic
        topics = [resolve_topic(self._topic_for, p.stream) for p in productions]
        new = set(topics) - self._checked
        if new:
            check_topics(self._kafka.connection, new, self._metadata_timeout)
            self._checked |= new
        txn_id = transactional_id(shard)
        self._txn_ids.add(txn_id)
        # One delivery per shard at a time: a second waits, then skips what the first committed.
        with _SHARDS.owner(self._kafka.cache_key, txn_id):
            return self._deliver(shard, productions, topics, txn_id, Deadline(self._timeout))

    def _deliver(
        self,
        shard: ShardRef,
        productions: Sequence[Production],
        topics: list[str],
        txn_id: str,
        deadline: Deadline,
    ) -> DeliveryReport:
        state = _SHARDS.get(self._kafka.cache_key, txn_id)
        if state is not None and self._doubt_outlived(state):
            state.drop()
            state = None
        fresh = state is None
        if state is None:
            state = self._init(shard, deadline)
        last: Abortable | None = None
        while True:
            try:
                try:
                    return self._transaction(state, shard, productions, topics, deadline)
                except Abortable as abortable:
                    last = abortable
                    state.abort(shard, deadline)
                    if deadline.expired():
                        break
                    time.sleep(RETRY_PAUSE_S)
                except (Fenced, MillstreamError):
                    raise
                except BaseException:
                    state.abort_quietly(deadline)
                    raise
            except Fenced as fenced:
                state.drop()
                if fresh:
                    raise classify(fenced.err, f"shard {shard}") from None
                # Cached from an earlier batch and fenced since: the shard ran in another
                # process meanwhile. This call owns the shard now, so take the id back once.
                state = self._init(shard, deadline)
                fresh = True
            except MillstreamError:
                state.abort_quietly(deadline)
                raise
        raise TransientError(
            f"shard {shard}: the Kafka transaction did not commit within {self._timeout:.0f}s "
            f"(last error: {last}); it was aborted and the checkpoints stay for the next batch"
        )

    def close(self) -> None:
        """Abort any open transaction of this sink's producers (those of the shards it
        delivered for) and drop them; other sinks' producers stay."""
        if not self._kafka.bound:
            return  # never delivered: no producers
        for state in _SHARDS.drain(self._kafka.cache_key, set(self._txn_ids)):
            state.abort_quietly(Deadline(self._timeout))
            state.close()

    # ------------------------------------------------------------------------------ one txn
    def _transaction(
        self,
        state: ShardProducer,
        shard: ShardRef,
        productions: Sequence[Production],
        topics: list[str],
        deadline: Deadline,
    ) -> DeliveryReport:
        """0. finish a commit left in doubt, 1. read progress (once per init), 2. skip delivered,
        3. begin, 4. produce and wait for acks, 5. add progress offsets, 6. commit."""
        if state.committing is not None:
            carried = state.committing
            if state.commit(shard, deadline, carried):
                self._confirm(state, shard, carried, deadline)
        for stream in sorted({p.stream for p in productions}):
            if stream not in state.progress:
                self._read_progress(state, shard, stream, deadline)
        todo = [
            (i, t, p)
            for i, (t, p) in enumerate(zip(topics, productions, strict=True))
            if p.seq > state.progress[p.stream]
        ]
        outcomes: list[tuple[int, int] | KafkaError | None] = [None] * len(productions)
        if todo:
            queue_full = (
                f"shard {shard}: the producer queue stayed full for {self._timeout:.0f}s; "
                "lower the batch size or raise queue.buffering.max.messages"
            )
            state.begin()

            def on_delivery(index: int, err: KafkaError | None, msg: Message) -> None:
                # Runs inside flush()/poll() on this thread. No lock: a fatal error can surface
                # mid-callback (confluent-kafka 2.16) and a held lock would then never be released.
                outcomes[index] = (
                    err if err is not None else (msg.partition() or 0, msg.offset() or 0)
                )

            for index, topic, production in todo:
                produce(
                    state.producer,
                    topic,
                    production,
                    functools.partial(on_delivery, index),
                    deadline,
                    queue_full=queue_full,
                    failed=functools.partial(state.fail, what=f"producing to {topic!r}"),
                    poll_failed=functools.partial(state.fail, what="poll"),
                )
            state.await_acks(shard, outcomes, todo, deadline)
            self._before_commit(shard)
            top: dict[str, int] = {}
            for _, _, production in todo:
                top[production.stream] = max(
                    top.get(production.stream, _NO_PROGRESS), production.seq
                )
            self._send_progress(state, shard, top, deadline)
            if state.commit(shard, deadline, top):
                self._confirm(state, shard, top, deadline)
        pairs = []
        for topic, production, outcome in zip(topics, productions, outcomes, strict=True):
            if outcome is None:
                delivery = Delivery(production.id, production.seq, topic, skipped=SKIPPED_DELIVERED)
            else:
                assert isinstance(outcome, tuple)
                delivery = Delivery(production.id, production.seq, topic, outcome[0], outcome[1])
            pairs.append((production, delivery))
        return DeliveryReport.build(shard, pairs)

    def _before_commit(self, shard: ShardRef) -> None:
        """Fault-injection point for tests: records are acknowledged, progress not yet sent."""
        fault_point("before_kafka_commit")  # a no-op unless a test installed a hook

    def _send_progress(
        self,
        state: ShardProducer,
        shard: ShardRef,
        top: dict[str, int],
        deadline: Deadline,
    ) -> None:
        for stream, seq in sorted(top.items()):
            offsets = [
                TopicPartition(self._progress_topic, _PROGRESS_PARTITION, seq + 1, f"seq={seq}")
            ]

            def send(offsets: list[TopicPartition] = offsets, stream: str = stream) -> None:
                state.producer.send_offsets_to_transaction(
                    offsets, state.group_meta[stream], max(0.1, deadline.left())
                )

            state.retrying(
                deadline,
                "send_offsets_to_transaction",
                functools.partial(state.bounded, shard, deadline, send),
            )

    def _doubt_outlived(self, state: ShardProducer) -> bool:
        return state.doubt_outlived(self._txn_timeout_s)

    # ------------------------------------------------------------------------------ init
    def _init(self, shard: ShardRef, deadline: Deadline) -> ShardProducer:
        """Create the shard's producer and init_transactions: aborts the previous owner's
        open transaction and fences it. Progress must be read after this, never before."""
        state = init_shard_producer(
            {**self._kafka.producer, "transactional.id": transactional_id(shard)},
            shard,
            deadline,
            forget=functools.partial(_SHARDS.forget, self._kafka.cache_key),
        )
        for old in _SHARDS.put(self._kafka.cache_key, state, self._cap):
            old.close()
        return state

    def fence(self, shard: ShardRef) -> str:
        """Fence whoever delivers `shard` now: init_transactions under its transactional id
        aborts its open transaction, and its next commit fails as fenced. For a pipeline given
        up for good (`millstream join recover --abandon`) whose process might only be paused.
        Returns the transactional id."""
        with _SHARDS.owner(self._kafka.cache_key, transactional_id(shard)):
            state = self._init(shard, Deadline(self._timeout))
            _SHARDS.pop(self._kafka.cache_key, state.txn_id)
            state.close()
            return state.txn_id

    def _read_progress(
        self, state: ShardProducer, shard: ShardRef, stream: str, deadline: Deadline
    ) -> None:
        """Highest delivered seq for (shard, stream), as committed by the last transaction."""
        state.progress[stream], state.group_meta[stream] = self._fetch_progress(
            shard, stream, deadline
        )

    def _confirm(
        self, state: ShardProducer, shard: ShardRef, top: dict[str, int], deadline: Deadline
    ) -> None:
        """Compare a resumed commit's reported success with the broker's progress offsets."""
        confirm_resumed_commit(
            functools.partial(self._fetch_progress, shard), state.txn_id, top, deadline
        )

    def _fetch_progress(self, shard: ShardRef, stream: str, deadline: Deadline) -> tuple[int, Any]:
        """(highest committed seq, consumer group metadata) of (shard, stream) on the broker."""
        return fetch_progress(self._kafka.connection, self._progress_topic, shard, stream, deadline)

    # ------------------------------------------------------------------------------ setup
    def _ensure_progress_topic(self) -> None:
        ensure_progress_topic(self._kafka.connection, self._progress_topic, self._metadata_timeout)

    def _probe_transactions(self) -> None:
        probe_transactions(self._kafka.producer, self._kafka.connection, self._metadata_timeout)
