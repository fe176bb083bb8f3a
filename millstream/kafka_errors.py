"""librdkafka errors as millstream errors: fenced, configuration (with the fix) or transient.

Shared by every millstream Kafka client that must tell the caller what to do about an error:
the sinks' producers and the start-up metadata checks (`millstream.kafka_admin`).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from millstream.errors import ConfigurationError, FencedError, MillstreamError, TransientError

__all__ = ["classify", "is_fenced", "kafka_error"]

_FENCED_CODES = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
}
_CONFIG_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "grant the principal Write and Describe on the topic",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: (
        "grant the principal Write and Describe on TransactionalId 'millstream.*'"
    ),
    KafkaError.GROUP_AUTHORIZATION_FAILED: (
        "grant the principal Read on consumer groups 'millstream.progress.*'"
    ),
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "grant the principal IdempotentWrite on the cluster",
    KafkaError.UNKNOWN_TOPIC_OR_PART: "create the topic before starting the pipeline",
    KafkaError.MSG_SIZE_TOO_LARGE: (
        "raise the topic's max.message.bytes and the producer's message.max.bytes, "
        "or produce smaller values"
    ),
    KafkaError._UNKNOWN_TOPIC: "create the topic before starting the pipeline",
    KafkaError._UNKNOWN_PARTITION: "the topic has fewer partitions than expected: recreate it",
    KafkaError.UNSUPPORTED_VERSION: "use Apache Kafka 2.5 or newer (or a compatible broker)",
    KafkaError._UNSUPPORTED_FEATURE: "use Apache Kafka 2.5 or newer (or a compatible broker)",
    KafkaError.INVALID_TRANSACTION_TIMEOUT: (
        "lower transaction_timeout_ms below the broker's transaction.max.timeout.ms"
    ),
    KafkaError._INVALID_ARG: "fix the Kafka client settings",
}


def kafka_error(exc: BaseException | None) -> KafkaError | None:
    """The KafkaError behind an exception, if any; drops the tracebacks of the chain.

    confluent-kafka 2.16 can raise a fatal error (for example _FENCED) from `flush()` as a
    SystemError whose cause is the KafkaException, so the cause chain is searched too. That path
    leaks a reference to the exceptions: their tracebacks would keep our frames, and through them
    a fenced producer with its threads and sockets, alive for good. So they are cut here.
    """
    chain: list[BaseException] = []
    while exc is not None and len(chain) < 4:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for link in chain:
        if isinstance(link, KafkaException) and link.args and isinstance(link.args[0], KafkaError):
            for other in chain:
                other.__traceback__ = None
            return link.args[0]
    return None


def is_fenced(err: KafkaError | None) -> bool:
    return err is not None and err.code() in _FENCED_CODES


def classify(err: KafkaError, what: str) -> MillstreamError:
    """Turn a librdkafka error into the millstream error that says what the caller must do."""
    code = err.code()
    if code in _FENCED_CODES:
        return FencedError(
            f"{what}: Kafka fenced this producer ({err.name()}): another process initialised the "
            "same transactional.id; this one is a zombie and stops"
        )
    if code in _CONFIG_CODES:
        return ConfigurationError(f"{what}: {err.name()} ({err.str()}): {_CONFIG_CODES[code]}")
    return TransientError(f"{what}: {err.name()} ({err.str()}); retry later")
