"""What every Kafka consumer of the injectors needs: take what is queued without waiting
for a full chunk, and turn a librdkafka error into what the caller must do.

Shared by the planner's probe (`_kafka_probe`), the readers (`_kafka_read`) and the event
log (`event_log`).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError

from millstream.errors import ConfigurationError, MillstreamError, TransientError


def next_events(consumer: Consumer, limit: int, timeout: float) -> list[Any]:
    """Whatever is queued (up to `limit`), waiting at most `timeout` only when nothing is.

    `Consumer.consume(n, timeout)` waits for all n messages, so a range that ends in offsets
    without records (markers, gaps) would cost the whole timeout; this never does.
    """
    messages = consumer.consume(limit, timeout=0)
    if messages:
        return messages  # type: ignore[no-any-return]
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max(1, limit - 1), timeout=0)]


def broker_error(err: KafkaError, what: str, servers: str) -> MillstreamError:
    """Map a librdkafka error to what the caller must do."""
    code = err.code()
    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        return ConfigurationError(
            f"{what}: offset out of range ({err.str()}). Records the checkpoint points at were "
            "deleted by retention or the topic was recreated: that is data loss. Start the "
            "query from a new checkpoint folder to accept it."
        )
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return ConfigurationError(
            f"{what}: the topic does not exist on {servers} ({err.str()}); create it first."
        )
    if code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    ):
        return ConfigurationError(
            f"{what}: {err.str()}; check the kafka.security.*, kafka.sasl.* and kafka.ssl.* "
            "options."
        )
    return TransientError(f"{what}: {err.str()} (broker {servers})")
