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
the shard's next delivery, never aborted (see `_commit`).

Caveats: Kafka expires the committed offsets of a group without members after
`offsets.retention.minutes` (7 days by default); progress matters only for checkpoints left
behind by a crash between commit and checkpoint deletion, so keep that retention longer than
any outage you recover from. On Tansu 0.6 a zombie whose only remaining call is the commit gets
its connection dropped (`_TIMED_OUT`, not `_FENCED`): it surfaces as TransientError after
`delivery_timeout_s`, and its transaction stays aborted.

Why offsets rather than a progress record in a compacted topic: reading such a record back needs
read_committed semantics over a whole partition, which a broker that serves aborted
transactional data (Tansu 0.6) gets wrong, and which on Apache Kafka stalls behind any other
shard's open transaction; an offset fetch is one small request with the same meaning everywhere.
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from millstream.errors import ConfigurationError, FencedError, MillstreamError, TransientError
from millstream.fault_points import fault_point
from millstream.headers import production_headers
from millstream.kafka_admin import check_topics
from millstream.kafka_errors import classify, is_fenced, kafka_error
from millstream.records import Production
from millstream.sinks._kafka import (
    Deadline,
    TopicFor,
    purge_quietly,
    resolve_topic,
    static_topics,
    topic_mapping,
)
from millstream.sinks._kafka_settings import KafkaSettings
from millstream.sinks.base import (
    SKIPPED_DELIVERED,
    BackpressureError,
    Delivery,
    DeliveryReport,
    ShardRef,
    Sink,
)

log = logging.getLogger(__name__)

PROGRESS_TOPIC = "__millstream_progress"
_PROGRESS_PARTITION = 0
_NO_PROGRESS = -1
_RETRY_PAUSE_S = 0.1
_FLUSH_SLICE_S = 0.5
_STUCK_GRACE_S = 5.0


def transactional_id(shard: ShardRef) -> str:
    """Deterministic per shard, so a new owner's init_transactions fences the old one."""
    return f"millstream.{shard.app}.{shard.computation}.{shard.shard}"


def progress_group(shard: ShardRef, stream: str) -> str:
    """The consumer group whose committed offset is `highest delivered seq + 1`."""
    return f"millstream.progress.{shard.app}.{shard.computation}.{shard.shard}.{stream}"


class _Fenced(Exception):
    """Kafka fenced the cached producer; the caller decides between re-init and FencedError."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


class _Abortable(Exception):
    """The transaction failed but the producer is fine: abort it and try again."""

    def __init__(self, err: KafkaError, what: str) -> None:
        super().__init__(f"{what}: {err.name()} ({err.str()})")
        self.err = err


@dataclass
class _ShardProducer:
    """A shard's producer in this process, and what it knows since its init_transactions."""

    producer: Producer
    txn_id: str
    progress: dict[str, int] = field(default_factory=dict)  # stream -> highest delivered seq
    group_meta: dict[str, Any] = field(default_factory=dict)  # stream -> ConsumerGroupMetadata
    in_transaction: bool = False
    # Set while a commit_transaction call has not returned a definite outcome: the progress
    # (stream -> seq) that transaction carries. Such a producer is never aborted or dropped:
    # its next delivery resumes the commit first (librdkafka's contract for a timed-out commit).
    committing: dict[str, int] | None = None
    committing_since: float = 0.0  # monotonic time the in-doubt commit was first attempted


class _ShardProducers:
    """Per-process LRU of shard producers: each holds threads and sockets, so the count is capped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[tuple[int, Any, str], _ShardProducer] = (
            collections.OrderedDict()
        )

    def get(self, config_key: Any, txn_id: str) -> _ShardProducer | None:
        key = (os.getpid(), config_key, txn_id)
        with self._lock:
            state = self._items.get(key)
            if state is not None:
                self._items.move_to_end(key)
            return state

    def put(self, config_key: Any, state: _ShardProducer, cap: int) -> list[_ShardProducer]:
        """Store and return the least recently used entries pushed over the cap."""
        pid = os.getpid()
        with self._lock:
            self._items[(pid, config_key, state.txn_id)] = state
            mine = [k for k in self._items if k[0] == pid and k[1] == config_key]
            return [self._items.pop(k) for k in mine[: max(0, len(mine) - cap)]]

    def pop(self, config_key: Any, txn_id: str) -> _ShardProducer | None:
        with self._lock:
            return self._items.pop((os.getpid(), config_key, txn_id), None)

    def drain(self, config_key: Any) -> list[_ShardProducer]:
        pid = os.getpid()
        with self._lock:
            keys = [k for k in self._items if k[0] == pid and k[1] == config_key]
            return [self._items.pop(k) for k in keys]


_SHARDS = _ShardProducers()
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
        deadline = Deadline(self._timeout)
        topics = [resolve_topic(self._topic_for, p.stream) for p in productions]
        new = set(topics) - self._checked
        if new:
            check_topics(self._kafka.connection, new, self._metadata_timeout)
            self._checked |= new
        txn_id = transactional_id(shard)
        state = _SHARDS.get(self._kafka.cache_key, txn_id)
        if state is not None and self._doubt_outlived(state):
            self._discard(state)
            state = None
        fresh = state is None
        if state is None:
            state = self._init(shard, deadline)
        last: _Abortable | None = None
        while True:
            try:
                try:
                    return self._transaction(state, shard, productions, topics, deadline)
                except _Abortable as abortable:
                    last = abortable
                    self._abort(state, shard, deadline)
                    if deadline.expired():
                        break
                    time.sleep(_RETRY_PAUSE_S)
                except (_Fenced, MillstreamError):
                    raise
                except BaseException:
                    self._abort_quietly(state, deadline)
                    raise
            except _Fenced as fenced:
                self._discard(state)
                if fresh:
                    raise classify(fenced.err, f"shard {shard}") from None
                # Cached from an earlier batch and fenced since: the shard ran in another
                # process meanwhile. This call owns the shard now, so take the id back once.
                state = self._init(shard, deadline)
                fresh = True
            except MillstreamError:
                self._abort_quietly(state, deadline)
                raise
        raise TransientError(
            f"shard {shard}: the Kafka transaction did not commit within {self._timeout:.0f}s "
            f"(last error: {last}); it was aborted and the checkpoints stay for the next batch"
        )

    def close(self) -> None:
        """Abort any open transaction of this sink's producers and drop them."""
        if not self._kafka.bound:
            return  # never delivered: no producers
        for state in _SHARDS.drain(self._kafka.cache_key):
            self._abort_quietly(state, Deadline(self._timeout))
            self._close_producer(state)

    # ------------------------------------------------------------------------------ one txn
    def _transaction(
        self,
        state: _ShardProducer,
        shard: ShardRef,
        productions: Sequence[Production],
        topics: list[str],
        deadline: Deadline,
    ) -> DeliveryReport:
        """0. finish a commit left in doubt, 1. read progress (once per init), 2. skip delivered,
        3. begin, 4. produce and wait for acks, 5. add progress offsets, 6. commit."""
        if state.committing is not None:
            self._commit(state, shard, deadline, state.committing)
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
            self._call(state, "begin_transaction", state.producer.begin_transaction)
            state.in_transaction = True

            def on_delivery(index: int, err: KafkaError | None, msg: Message) -> None:
                # Runs inside flush()/poll() on this thread. No lock: a fatal error can surface
                # mid-callback (confluent-kafka 2.16) and a held lock would then never be released.
                outcomes[index] = (
                    err if err is not None else (msg.partition() or 0, msg.offset() or 0)
                )

            for index, topic, production in todo:
                self._produce(
                    state, shard, topic, production, functools.partial(on_delivery, index), deadline
                )
            self._await(state, shard, outcomes, todo, deadline)
            self._before_commit(shard)
            top: dict[str, int] = {}
            for _, _, production in todo:
                top[production.stream] = max(
                    top.get(production.stream, _NO_PROGRESS), production.seq
                )
            self._send_progress(state, shard, top, deadline)
            self._commit(state, shard, deadline, top)
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

    def _produce(
        self,
        state: _ShardProducer,
        shard: ShardRef,
        topic: str,
        production: Production,
        on_delivery: Any,
        deadline: Deadline,
    ) -> None:
        while True:
            try:
                state.producer.produce(
                    topic,
                    key=production.key.encode("utf-8"),
                    value=production.value,
                    timestamp=production.timestamp,
                    headers=production_headers(production),
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                if deadline.expired():
                    raise BackpressureError(
                        f"shard {shard}: the producer queue stayed full for {self._timeout:.0f}s; "
                        "lower the batch size or raise queue.buffering.max.messages"
                    ) from None
                self._call(state, "poll", lambda: state.producer.poll(0.05))
            except KafkaException as exc:
                self._raise(state, exc, f"producing to {topic!r}")

    def _await(
        self,
        state: _ShardProducer,
        shard: ShardRef,
        outcomes: list[tuple[int, int] | KafkaError | None],
        todo: list[tuple[int, str, Production]],
        deadline: Deadline,
    ) -> None:
        """Wait until every record is acknowledged; a failed record fails the transaction."""
        while any(outcomes[i] is None for i, _, _ in todo):
            if deadline.expired():
                raise _Abortable(
                    KafkaError(KafkaError._TIMED_OUT, "records unacknowledged"),
                    f"shard {shard}: waiting for acknowledgements",
                )
            self._call(
                state, "flush", lambda: state.producer.flush(min(_FLUSH_SLICE_S, deadline.left()))
            )
        for i, topic, _ in todo:
            outcome = outcomes[i]
            if not isinstance(outcome, KafkaError):
                continue
            what = f"delivering to {topic!r}"
            if is_fenced(outcome) or outcome.fatal():
                self._raise_error(state, outcome, what)
            error = classify(outcome, f"{state.txn_id}: {what}")
            if isinstance(error, ConfigurationError):
                raise error
            # Purged or timed-out records: abort. The abort itself reveals a fenced producer.
            raise _Abortable(outcome, f"{state.txn_id}: {what}")

    def _send_progress(
        self,
        state: _ShardProducer,
        shard: ShardRef,
        top: dict[str, int],
        deadline: Deadline,
    ) -> None:
        for stream, seq in sorted(top.items()):
            offsets = [
                TopicPartition(self._progress_topic, _PROGRESS_PARTITION, seq + 1, f"seq={seq}")
            ]
            self._retrying(
                state,
                deadline,
                "send_offsets_to_transaction",
                lambda o=offsets, s=stream: self._bounded(
                    state,
                    shard,
                    deadline,
                    lambda: state.producer.send_offsets_to_transaction(
                        o, state.group_meta[s], max(0.1, deadline.left())
                    ),
                ),
            )

    def _bounded(
        self, state: _ShardProducer, shard: ShardRef, deadline: Deadline, call: Any
    ) -> None:
        """Run a transactional call that may ignore its own timeout, and give up on it.

        librdkafka's send_offsets_to_transaction can block forever while the group coordinator
        is unreachable (confluentinc/librdkafka#5456, #5511; seen here after a broker restart).
        The call runs in a helper thread; if it has not returned `_STUCK_GRACE_S` after the
        delivery deadline, the producer is dropped (its thread stays blocked: a bounded leak,
        instead of a shard that never delivers again) and the delivery fails as retriable. The
        next delivery initialises the transactional id again, which aborts the transaction.
        """
        box: dict[str, BaseException] = {}

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # re-raised in the calling thread
                box["error"] = exc

        helper = threading.Thread(target=run, name=f"millstream-txn-{state.txn_id}", daemon=True)
        helper.start()
        helper.join(deadline.left() + _STUCK_GRACE_S)
        if helper.is_alive():
            self._discard(state)
            raise TransientError(
                f"shard {shard}: send_offsets_to_transaction did not return within "
                f"{self._timeout + _STUCK_GRACE_S:.0f}s although given {self._timeout:.0f}s (a "
                "librdkafka defect while the group coordinator is unreachable); the producer was "
                "dropped and the checkpoints stay for the next delivery"
            )
        if "error" in box:
            raise box["error"]

    def _commit(
        self, state: _ShardProducer, shard: ShardRef, deadline: Deadline, top: dict[str, int]
    ) -> None:
        """Commit (or resume committing) the open transaction that carries progress `top`.

        A commit that times out has an unknown outcome: the broker may have committed it. Then
        aborting is not allowed (librdkafka answers _CONFLICT) and dropping the producer would
        leave the outcome to the progress read of the next producer. So the producer is kept
        with `committing` set, and the next delivery of the shard calls commit_transaction
        again until librdkafka returns a definite result (docs of rd_kafka_commit_transaction).
        """
        if state.committing is None:
            state.committing, state.committing_since = top, time.monotonic()
        while True:
            try:
                state.producer.commit_transaction(max(0.1, deadline.left()))
                break
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not err.txn_requires_abort():
                    if not deadline.expired():
                        time.sleep(_RETRY_PAUSE_S)
                        continue
                    raise TransientError(
                        f"shard {shard}: commit_transaction for {state.txn_id!r} did not return "
                        f"within {self._timeout:.0f}s ({err.name()}); its outcome is unknown, so "
                        "the checkpoints stay and the next delivery resumes the commit"
                    ) from None
                state.committing = None  # a definite failure: the transaction did not commit
                self._raise(state, exc, "commit_transaction")
        state.committing = None
        state.in_transaction = False
        for stream, seq in top.items():
            state.progress[stream] = max(state.progress[stream], seq)

    def _doubt_outlived(self, state: _ShardProducer) -> bool:
        """A commit in doubt for longer than the transaction timeout: stop resuming it.

        By then the coordinator has finished that transaction one way or the other (a commit
        it started completes; one it never saw is aborted by the timeout), so a new producer's
        init_transactions and progress read give the answer, and a resume that keeps timing out
        cannot hold the shard forever.
        """
        if state.committing is None:
            return False
        if time.monotonic() - state.committing_since <= self._txn_timeout_s:
            return False
        log.warning(
            "%s: commit in doubt for over %.0fs; re-initialising the producer, whose progress "
            "read settles what was delivered",
            state.txn_id,
            self._txn_timeout_s,
        )
        return True

    # ------------------------------------------------------------------------------ init
    def _init(self, shard: ShardRef, deadline: Deadline) -> _ShardProducer:
        """Create the shard's producer and init_transactions: aborts the previous owner's
        open transaction and fences it. Progress must be read after this, never before."""
        txn_id = transactional_id(shard)
        producer = Producer({**self._kafka.producer, "transactional.id": txn_id})
        state = _ShardProducer(producer, txn_id)
        while True:
            try:
                producer.init_transactions(max(0.1, deadline.left()))
                break
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not deadline.expired():
                    time.sleep(_RETRY_PAUSE_S)
                    continue
                self._close_producer(state)
                if err is None:
                    raise
                if err.code() == KafkaError._TIMED_OUT:
                    raise TransientError(
                        f"shard {shard}: init_transactions for {txn_id!r} timed out after "
                        f"{self._timeout:.0f}s: the transaction coordinator is unavailable (on a "
                        "single-broker Kafka set transaction.state.log.replication.factor=1 and "
                        "transaction.state.log.min.isr=1)"
                    ) from None
                raise classify(err, f"shard {shard}: init_transactions") from None
        for old in _SHARDS.put(self._kafka.cache_key, state, self._cap):
            self._close_producer(old)
        return state

    def _read_progress(
        self, state: _ShardProducer, shard: ShardRef, stream: str, deadline: Deadline
    ) -> None:
        """Highest delivered seq for (shard, stream), as committed by the last transaction."""
        group = progress_group(shard, stream)
        consumer = Consumer(
            {
                **self._kafka.connection,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
        try:
            tp = TopicPartition(self._progress_topic, _PROGRESS_PARTITION)
            while True:
                error: KafkaError | None
                try:
                    (got,) = consumer.committed([tp], timeout=max(0.1, deadline.left()))
                    error = got.error
                except KafkaException as exc:
                    error = kafka_error(exc)
                    if error is None:
                        raise
                if error is None:
                    break
                if not error.retriable() or deadline.expired():
                    raise classify(error, f"shard {shard}: reading progress of group {group!r}")
                time.sleep(_RETRY_PAUSE_S)
            state.progress[stream] = got.offset - 1 if got.offset >= 0 else _NO_PROGRESS
            state.group_meta[stream] = consumer.consumer_group_metadata()
        finally:
            consumer.close()

    # ------------------------------------------------------------------------------ errors
    def _call(self, state: _ShardProducer, what: str, fn: Any) -> Any:
        try:
            return fn()
        except (KafkaException, SystemError) as exc:
            self._raise(state, exc, what)

    def _retrying(self, state: _ShardProducer, deadline: Deadline, what: str, fn: Any) -> None:
        """Repeat a transactional call while librdkafka says it is retriable (its contract)."""
        while True:
            try:
                fn()
                return
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not deadline.expired():
                    time.sleep(_RETRY_PAUSE_S)
                    continue
                self._raise(state, exc, what)

    def _raise(self, state: _ShardProducer, exc: BaseException, what: str) -> None:
        err = kafka_error(exc)
        if err is None:
            raise exc
        self._raise_error(state, err, what)

    def _raise_error(self, state: _ShardProducer, err: KafkaError, what: str) -> None:
        if is_fenced(err):
            raise _Fenced(err)
        if err.fatal():
            self._discard(state)
            raise classify(err, f"{state.txn_id}: {what} (fatal, producer dropped)")
        if err.txn_requires_abort() or err.retriable() or err.code() == KafkaError._TIMED_OUT:
            raise _Abortable(err, f"{state.txn_id}: {what}")
        raise classify(err, f"{state.txn_id}: {what}")

    def _abort(self, state: _ShardProducer, shard: ShardRef, deadline: Deadline) -> None:
        """Abort the open transaction so the next attempt starts clean.

        Raises _Fenced when the abort reveals a newer producer; any other failure drops the
        producer (Kafka aborts its transaction when the id is initialised again) and raises.
        """
        if not state.in_transaction or state.committing is not None:
            return
        while True:
            try:
                state.producer.abort_transaction(max(1.0, deadline.left()))
                state.in_transaction = False
                return
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not deadline.expired():
                    time.sleep(_RETRY_PAUSE_S)
                    continue
                if is_fenced(err):
                    raise _Fenced(err) from None  # type: ignore[arg-type]
                self._discard(state)
                raise TransientError(
                    f"shard {shard}: aborting the transaction failed ({exc}); the producer was "
                    "dropped and the next delivery re-initialises it, which aborts the transaction"
                ) from None

    def _abort_quietly(self, state: _ShardProducer, deadline: Deadline) -> None:
        """Best effort on the way out of an error: abort, else drop the producer. A producer
        whose commit is in doubt is kept as it is, for the next delivery to resume."""
        if not state.in_transaction or state.committing is not None:
            return
        try:
            state.producer.abort_transaction(max(1.0, deadline.left()))
            state.in_transaction = False
        except (KafkaException, SystemError):
            self._discard(state)

    def _discard(self, state: _ShardProducer) -> None:
        """Forget a producer that is fenced, fatal or stuck; the next call re-initialises."""
        _SHARDS.pop(self._kafka.cache_key, state.txn_id)
        self._close_producer(state)

    @staticmethod
    def _close_producer(state: _ShardProducer) -> None:
        # Never deliver what a dropped producer still queues: it belongs to an aborted transaction.
        purge_quietly(state.producer)
        state.in_transaction = False

    # ------------------------------------------------------------------------------ setup
    def _ensure_progress_topic(self) -> None:
        admin = AdminClient(dict(self._kafka.connection))
        try:
            metadata = admin.list_topics(timeout=self._metadata_timeout)
        except KafkaException as exc:
            raise TransientError(
                f"Kafka at {self._kafka.connection.get('bootstrap.servers')} did not answer ({exc}): "
                "check the bootstrap servers and that the broker runs"
            ) from None
        if self._progress_topic in metadata.topics:
            return
        topic = NewTopic(
            self._progress_topic,
            num_partitions=1,
            replication_factor=-1,
            config={"cleanup.policy": "compact", "retention.ms": "-1"},
        )
        future = admin.create_topics([topic], operation_timeout=self._metadata_timeout)[
            self._progress_topic
        ]
        try:
            future.result(timeout=self._metadata_timeout)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise ConfigurationError(
                f"cannot create the progress topic {self._progress_topic!r} ({exc}): create it "
                "yourself (1 partition, cleanup.policy=compact) or grant CreateTopics"
            ) from None

    def _probe_transactions(self) -> None:
        """init_transactions with a throw-away id: proves the broker and ACLs allow them."""
        probe_id = f"millstream.setup-probe.{socket.gethostname()}.{os.getpid()}"
        producer = Producer({**self._kafka.producer, "transactional.id": probe_id})
        try:
            producer.init_transactions(self._metadata_timeout)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError._TIMED_OUT:
                raise ConfigurationError(
                    f"Kafka at {self._kafka.connection.get('bootstrap.servers')} did not initialise a "
                    f"transaction within {self._metadata_timeout:.0f}s: transactions need a "
                    "transaction coordinator (on a single-broker Apache Kafka set "
                    "transaction.state.log.replication.factor=1 and "
                    "transaction.state.log.min.isr=1), or use KafkaIdempotentSink"
                ) from None
            if err is not None:
                error: MillstreamError = classify(err, "transactions are unavailable")
                if isinstance(error, TransientError | FencedError):
                    error = ConfigurationError(
                        f"transactions are unavailable on {self._kafka.connection.get('bootstrap.servers')}"
                        f": {err.name()} ({err.str()}); use Apache Kafka 2.5+ or KafkaIdempotentSink"
                    )
                raise error from None
            raise
        finally:
            producer.purge(in_queue=True, in_flight=False, blocking=False)
