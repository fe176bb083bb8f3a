"""Idempotent Kafka delivery (internal streams, at-least-once outputs) on a real broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from confluent_kafka.admin import AdminClient

from millstream.errors import ConfigurationError
from millstream.records import Production
from millstream.sinks.base import ShardRef
from millstream.sinks.dedup_reader import DedupReader, RedisDedupReader, message_id
from millstream.sinks.kafka_idempotent import KafkaIdempotentSink
from millstream.sinks.kafka_stream import KafkaStreamSink
from millstream.testing.committed_reader import read_with_consumer

SHARD = ShardRef("app", "comp", 7)


def productions(first: int, last: int, stream: str = "s") -> list[Production]:
    return [
        Production(
            stream=stream,
            key=f"clé-{seq % 4}",
            value=b"\x00\xffv" + str(seq).encode(),
            timestamp=1_700_000_000_000 + seq,
            id=uuid.UUID(int=seq).bytes,
            system_time=1_700_000_050_000 - seq,
            seq=seq,
            headers=(("trace", b"\x00\x01"), ("trace", b"dup"), ("empty", b"")),
        )
        for seq in range(first, last)
    ]


@pytest.fixture
def sinks() -> Iterator[list[KafkaStreamSink]]:
    made: list[KafkaStreamSink] = []
    try:
        yield made
    finally:
        for sink in made:
            sink.close()


def test_report_offsets_and_headers_are_exact(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str], sinks: list[KafkaStreamSink]
) -> None:
    topic = kafka_topic_factory(partitions=3)
    sink = KafkaStreamSink({"bootstrap.servers": kafka_bootstrap}, lambda stream: topic)
    sinks.append(sink)
    sink.setup()
    batch = productions(0, 30)
    report = sink.deliver(SHARD, batch)

    assert report.delivered == 30 and report.skipped == 0
    by_id = {d.id: d for d in report.deliveries}
    messages = read_with_consumer(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    assert len(messages) == 30
    for msg in messages:
        delivery = by_id[message_id(msg)]
        assert (delivery.topic, delivery.partition, delivery.offset) == (
            msg.topic(),
            msg.partition(),
            msg.offset(),
        )
    production = {p.id: p for p in batch}
    for msg in messages:
        p = production[message_id(msg)]
        assert msg.key() == p.key.encode("utf-8")
        assert msg.value() == p.value
        assert msg.timestamp()[1] == p.timestamp
        assert msg.headers() == [
            ("ms-id", p.id),
            ("ms-system-time", p.system_time.to_bytes(8, "big", signed=True)),
            ("ms-event-time", p.timestamp.to_bytes(8, "big", signed=True)),
            ("trace", b"\x00\x01"),
            ("trace", b"dup"),
            ("empty", b""),
        ]
    # per-partition summary: max offset, min event time, min system time
    for (t, partition), progress in report.partitions.items():
        mine = [production[m.headers()[0][1]] for m in messages if m.partition() == partition]
        assert t == topic
        assert progress.max_offset == max(
            m.offset() for m in messages if m.partition() == partition
        )
        assert progress.min_event_time == min(p.timestamp for p in mine)
        assert progress.min_system_time == min(p.system_time for p in mine)
    # same key -> same partition (murmur2, like the Java client)
    partition_of: dict[bytes, set[int]] = {}
    for msg in messages:
        partition_of.setdefault(msg.key(), set()).add(msg.partition())
    assert all(len(parts) == 1 for parts in partition_of.values())


def test_empty_delivery_touches_nothing(kafka_bootstrap: str) -> None:
    sink = KafkaStreamSink({"bootstrap.servers": kafka_bootstrap}, "unused-topic")
    assert sink.deliver(SHARD, []).deliveries == ()


def test_missing_topic_is_a_configuration_error_not_an_auto_create(kafka_bootstrap: str) -> None:
    missing = f"missing-{uuid.uuid4().hex}"
    sink = KafkaStreamSink({"bootstrap.servers": kafka_bootstrap}, {"s": missing})
    with pytest.raises(ConfigurationError, match=missing):
        sink.setup()
    with pytest.raises(ConfigurationError, match=missing):
        sink.deliver(SHARD, productions(0, 1))
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert missing not in admin.list_topics(timeout=10).topics
    with pytest.raises(ConfigurationError, match="no topic for stream 'other'"):
        sink.deliver(SHARD, productions(0, 1, stream="other"))


def test_idempotent_sink_with_dedup_reader_is_exactly_once(
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
    sinks: list[KafkaStreamSink],
    redis_client: redis.Redis,
    redis_namespace: str,
) -> None:
    topic = kafka_topic_factory(partitions=2)
    sink = KafkaIdempotentSink({"bootstrap.servers": kafka_bootstrap}, topic)
    sinks.append(sink)
    sink.setup()
    sink.deliver(SHARD, productions(0, 10))
    # a failed batch is delivered again with newer checkpoints: 5..9 arrive twice
    sink.deliver(SHARD, productions(5, 15))
    sink.deliver(SHARD, productions(5, 15))

    messages = read_with_consumer(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    assert len(messages) == 30
    expected = {p.id for p in productions(0, 15)}

    reader = DedupReader(max_ids=1000)
    unique = list(reader.filter(messages))
    assert sorted(message_id(m) for m in unique) == sorted(expected)
    assert reader.duplicates == 15

    shared = RedisDedupReader(redis_client, redis_namespace, ttl_s=60)
    first_half, second_half = messages[:12], messages[12:]
    fresh = shared.filter(first_half)
    shared.mark(fresh)
    fresh += shared.filter(second_half)
    assert sorted(message_id(m) for m in fresh) == sorted(expected)
    again = RedisDedupReader(redis_client, redis_namespace, ttl_s=60)  # a restarted reader
    shared.mark(fresh)
    assert again.filter(messages) == []


def test_idempotent_zombie_writes_are_dropped_by_the_dedup_reader(
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
    sinks: list[KafkaStreamSink],
) -> None:
    """An idempotent producer cannot be fenced: a zombie task (an old owner of the shard that
    wakes up) writes its stale productions again, interleaved with the new owner's. Its records
    carry the same production ids, so the consumer helper still sees each production once."""
    topic = kafka_topic_factory(partitions=2)
    owner = KafkaIdempotentSink({"bootstrap.servers": kafka_bootstrap}, topic)
    zombie = KafkaIdempotentSink({"bootstrap.servers": kafka_bootstrap}, topic)
    sinks.extend([owner, zombie])
    owner.deliver(SHARD, productions(0, 10))
    owner.deliver(SHARD, productions(10, 20))
    zombie.deliver(SHARD, productions(0, 10))  # its checkpoints were taken before the first
    owner.deliver(SHARD, productions(20, 25))
    zombie.deliver(SHARD, productions(5, 12))

    messages = read_with_consumer(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    assert len(messages) == 25 + 10 + 7
    reader = DedupReader(max_ids=1000)
    unique = list(reader.filter(messages))
    assert sorted(message_id(m) for m in unique) == sorted(p.id for p in productions(0, 25))
    assert reader.duplicates == 17
    assert sorted(m.value() for m in unique) == sorted(p.value for p in productions(0, 25))
