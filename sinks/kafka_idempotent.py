"""At-least-once Kafka output for consumers outside millstream, deduplicated on the reader side.

Cheaper than `KafkaTransactionalSink`: no transaction per batch and any isolation level works,
but a re-delivery after a failed `deliver` (a crash, a timeout) writes some records twice.
Every record carries its production id in the `ms-id` header, so a reader that drops ids it
has seen (`millstream.sinks.dedup_reader.DedupReader`) sees each production exactly once.
"""

from __future__ import annotations

from millstream.sinks.kafka_stream import KafkaStreamSink


class KafkaIdempotentSink(KafkaStreamSink):
    """Idempotent producer (no duplicates from librdkafka's own retries), `ms-id` on every record.

    Same constructor and record layout as `KafkaStreamSink`: `KafkaIdempotentSink(topic="out")`
    takes the Kafka settings of the application that runs it, `KafkaIdempotentSink(kafka_config,
    topic_for, *, delivery_timeout_s=30.0, ...)` uses the ones given.
    """
