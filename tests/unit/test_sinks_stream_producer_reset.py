"""An idempotent sink whose producer the broker rejects replaces it instead of reusing it."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError

from millstream.errors import TransientError
from millstream.sinks.kafka_idempotent import KafkaIdempotentSink
from millstream.sinks.kafka_stream import _PRODUCERS


def cached_producer(sink: KafkaIdempotentSink) -> SimpleNamespace:
    purged: list[bool] = []
    producer = SimpleNamespace(purge=lambda **_: purged.append(True), purged=purged)
    _PRODUCERS.put(sink._kafka.cache_key, producer)
    return producer


def test_a_fenced_producer_is_dropped_and_purged() -> None:
    # Seen on Tansu after a broker restart: every delivery of the kept producer was fenced.
    sink = KafkaIdempotentSink({"bootstrap.servers": "127.0.0.1:1"}, "out")
    producer = cached_producer(sink)
    error = sink._failure(KafkaError(KafkaError.PRODUCER_FENCED, "fenced"), "shard 0")
    assert isinstance(error, TransientError)
    assert "replaced" in str(error)
    assert _PRODUCERS.get(sink._kafka.cache_key) is None
    assert producer.purged == [True]


def test_a_fatal_error_drops_the_producer_too() -> None:
    sink = KafkaIdempotentSink({"bootstrap.servers": "127.0.0.1:2"}, "out")
    cached_producer(sink)
    error = sink._failure(KafkaError(KafkaError._FATAL, "fatal", fatal=True), "shard 0")
    assert isinstance(error, TransientError)
    assert _PRODUCERS.get(sink._kafka.cache_key) is None


def test_a_retriable_error_keeps_the_producer() -> None:
    sink = KafkaIdempotentSink({"bootstrap.servers": "127.0.0.1:3"}, "out")
    producer = cached_producer(sink)
    error = sink._failure(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), "shard 0")
    assert isinstance(error, TransientError)
    assert _PRODUCERS.get(sink._kafka.cache_key) is producer
    assert producer.purged == []
