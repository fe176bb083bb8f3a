"""Idempotent Kafka delivery: internal streams between computations, at-least-once outputs.

At-least-once plus the `ms-id` header is exactly-once processing downstream: the consuming
computation (or `millstream.sinks.dedup_reader` outside millstream) drops ids it has seen.
The idempotent producer (enable.idempotence, acks=all) keeps librdkafka's own retries from
writing duplicates or reordering; only a re-delivery after a failed `deliver` can duplicate.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Self

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from millstream.errors import ConfigurationError, MillstreamError, TransientError
from millstream.kafka_admin import check_topics
from millstream.kafka_errors import classify, is_fenced, kafka_error
from millstream.records import Production
from millstream.sinks._kafka import (
    Deadline,
    ProcessCache,
    TopicFor,
    purge_quietly,
    resolve_topic,
    static_topics,
    topic_mapping,
)
from millstream.sinks._kafka_settings import KafkaSettings
from millstream.sinks._produce import produce
from millstream.sinks.base import Delivery, DeliveryReport, ShardRef, Sink

_PRODUCERS: ProcessCache[Producer] = ProcessCache()
_CHECKED: ProcessCache[int] = ProcessCache()  # (bootstrap, topic) -> partition count
_FLUSH_SLICE_S = 0.5

Outcome = tuple[int, int] | KafkaError | None


class KafkaStreamSink(Sink):
    """Writes productions to Kafka with an idempotent producer, one record per production.

    `topic="name"` writes every production to one topic; `topic_for` maps a production's stream
    to a topic (a topic name, a dict, or a function). `kafka_config` is the cluster's librdkafka
    settings; without it the sink takes its application's when the runtime binds it (`bind`).
    Records: key = production key (UTF-8), value, timestamp = event time, headers `ms-id`,
    `ms-system-time`, `ms-event-time` (see `millstream.headers`). Partitioning uses
    `murmur2_random`, the Java client's default, so keyed records land where Java producers
    would put them. `deliver` waits until every record is acknowledged by all in-sync replicas,
    or raises TransientError once `delivery_timeout_s` has passed.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, str] | None = None,
        topic_for: TopicFor | None = None,
        *,
        topic: str | None = None,
        delivery_timeout_s: float = 30.0,
        producer_config: Mapping[str, Any] | None = None,
        metadata_timeout_s: float = 10.0,
    ) -> None:
        if delivery_timeout_s <= 0:
            raise ConfigurationError(f"delivery_timeout_s={delivery_timeout_s} must be positive")
        self._timeout = float(delivery_timeout_s)
        self._metadata_timeout = float(metadata_timeout_s)
        self._kafka = KafkaSettings(
            type(self).__name__,
            kafka_config,
            producer_config,
            {
                "enable.idempotence": True,
                "acks": "all",
                "allow.auto.create.topics": False,
                "message.timeout.ms": int(self._timeout * 1000),
                "partitioner": (producer_config or {}).get("partitioner", "murmur2_random"),
                "linger.ms": (producer_config or {}).get("linger.ms", 5),
            },
        )
        # Checked after the settings, so that KafkaTransactionalSink("out") hears that "out"
        # went where the settings go.
        self._topic_for = topic_mapping(type(self).__name__, topic_for, topic)

    def bind(self, kafka_config: Mapping[str, str]) -> Self:
        if self._kafka.bound:
            return self
        bound = copy.copy(self)
        bound._kafka = self._kafka.bind(kafka_config)
        return bound

    def setup(self) -> None:
        """Fail fast: the known topics exist and we may describe them. The producer is made
        here too: it gets its producer id (about 0.5 s) before the first delivery needs it."""
        connection = self._kafka.connection
        for topic, count in check_topics(
            connection, static_topics(self._topic_for), self._metadata_timeout
        ).items():
            _CHECKED.put((connection["bootstrap.servers"], topic), count)
        self._producer()

    def deliver(self, shard: ShardRef, productions: Sequence[Production]) -> DeliveryReport:
        if not productions:
            return DeliveryReport(shard)
        deadline = Deadline(self._timeout)
        topics = [resolve_topic(self._topic_for, p.stream) for p in productions]
        self._check_new_topics(topics)
        producer = self._producer()
        outcomes: list[Outcome] = [None] * len(productions)

        def on_delivery(index: int, err: KafkaError | None, msg: Message) -> None:
            # Runs inside flush()/poll() on this thread. No lock: a fatal error can surface
            # mid-callback (confluent-kafka 2.16) and a held lock would then never be released.
            outcomes[index] = err if err is not None else (msg.partition() or 0, msg.offset() or 0)

        for index, (topic, production) in enumerate(zip(topics, productions, strict=True)):
            produce(
                producer,
                topic,
                production,
                functools.partial(on_delivery, index),
                deadline,
                queue_full=(
                    f"shard {shard}: the producer queue for {topic!r} stayed full for "
                    f"{self._timeout:.0f}s: Kafka accepts records slower than they are "
                    "produced; lower the batch size or raise queue.buffering.max.messages"
                ),
                failed=functools.partial(self._raise, f"shard {shard}: producing to {topic!r}"),
            )
        while any(o is None for o in outcomes):
            if deadline.expired():
                raise TransientError(
                    f"shard {shard}: {sum(o is None for o in outcomes)} of {len(outcomes)} "
                    f"records unacknowledged after {self._timeout:.0f}s: the broker is slow or "
                    "unreachable; the checkpoints stay and are delivered again"
                )
            try:
                producer.flush(min(_FLUSH_SLICE_S, deadline.left()))
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is None:
                    raise
                raise self._failure(err, f"shard {shard}: flushing") from None
        pairs = []
        for topic, production, outcome in zip(topics, productions, outcomes, strict=True):
            if isinstance(outcome, KafkaError):
                raise self._failure(outcome, f"shard {shard}: delivering to {topic!r}")
            assert outcome is not None
            partition, offset = outcome
            pairs.append(
                (production, Delivery(production.id, production.seq, topic, partition, offset))
            )
        return DeliveryReport.build(shard, pairs)

    def close(self) -> None:
        """Flush what is queued (bounded by the delivery timeout) and drop the producer."""
        if not self._kafka.bound:
            return  # never delivered: no producer
        producer = _PRODUCERS.pop(self._kafka.cache_key)
        if producer is not None:
            producer.flush(self._timeout)

    # ------------------------------------------------------------------------------ internals
    def _failure(self, err: KafkaError, what: str) -> MillstreamError:
        """The error to raise for `err`; a fatal or fenced producer is dropped first.

        An idempotent producer has no transactional.id, so no other process can own it: being
        fenced means the broker no longer accepts its producer id and epoch. Kept, it would fail
        every later delivery the same way; a new producer gets a new producer id. What it still
        queues is purged: those productions stay checkpointed and are delivered again.
        """
        error = classify(err, what)
        if not (err.fatal() or is_fenced(err)):
            return error
        producer = _PRODUCERS.pop(self._kafka.cache_key)
        if producer is not None:
            purge_quietly(producer)
        if isinstance(error, ConfigurationError):
            return error
        return TransientError(
            f"{what}: {err.name()} ({err.str()}): the broker rejects this producer for good; "
            "it was replaced, and the checkpoints are delivered again by the next one"
        )

    def _producer(self) -> Producer:
        producer = _PRODUCERS.get(self._kafka.cache_key)
        if producer is None:
            producer = _PRODUCERS.put(self._kafka.cache_key, Producer(dict(self._kafka.producer)))
        return producer

    def _check_new_topics(self, topics: list[str]) -> None:
        connection = self._kafka.connection
        bootstrap = connection["bootstrap.servers"]
        new = {t for t in topics if _CHECKED.get((bootstrap, t)) is None}
        for topic, count in check_topics(connection, new, self._metadata_timeout).items():
            _CHECKED.put((bootstrap, topic), count)

    def _raise(self, what: str, exc: BaseException) -> NoReturn:
        err = kafka_error(exc)
        if err is None:
            raise exc
        raise self._failure(err, what) from None
