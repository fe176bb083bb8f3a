"""Where a computation's productions go outside its query, and where Redis and Kafka are.

Factories, not clients: a target is shipped to whichever process delivers (the driver, or a
shard task for weak productions), which opens its own producer there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PARTITIONS = 4  # for internal topics created here; existing ones keep their own count
TOPIC_TIMEOUT_S = 30.0  # a metadata request at start-up


@dataclass(frozen=True)
class Endpoints:
    """Where Redis and Kafka are, once embedded services (if any) are up."""

    redis_url: str
    kafka: dict[str, str]  # librdkafka config: bootstrap.servers plus pass-through settings


@dataclass(frozen=True)
class InternalStreamSink:
    """Factory for the idempotent producer that writes an internal stream's topic."""

    topic: str
    kafka: tuple[tuple[str, str], ...]

    def __call__(self) -> Any:
        from millstream.sinks.kafka_stream import KafkaStreamSink

        return KafkaStreamSink(dict(self.kafka), topic_for=lambda _stream: self.topic)


@dataclass(frozen=True)
class UserSink:
    sink: Any

    @classmethod
    def bound(cls, sink: Any, kafka: dict[str, str]) -> UserSink:
        """The user's sink bound on the driver to the application's Kafka settings: a sink
        declared without any (`KafkaTransactionalSink(topic=...)`) delivers to this cluster."""
        from millstream.sinks.base import bind_sink

        return cls(bind_sink(sink, kafka))

    def __call__(self) -> Any:
        return self.sink
