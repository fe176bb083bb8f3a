"""Sinks: where checkpointed productions go, each with the guarantee it can give.

- `KafkaStreamSink`: internal streams (idempotent producer, `ms-id` header; consumers dedup).
- `KafkaTransactionalSink`: exactly-once for external `read_committed` consumers.
- `KafkaIdempotentSink` + `DedupReader`: at-least-once, deduplicated by the reader.
- `RedisSink`: upserts a replay cannot regress. `FileSink`: atomic JSON-lines files.
"""

from millstream.sinks.base import (
    BackpressureError,
    Delivery,
    DeliveryReport,
    PartitionProgress,
    ShardRef,
    Sink,
)
from millstream.sinks.dedup_reader import DedupReader, RedisDedupReader
from millstream.sinks.file_sink import FileSink
from millstream.sinks.kafka_idempotent import KafkaIdempotentSink
from millstream.sinks.kafka_stream import KafkaStreamSink
from millstream.sinks.kafka_transactional import KafkaTransactionalSink
from millstream.sinks.redis_sink import RedisSink

__all__ = [
    "BackpressureError",
    "DedupReader",
    "Delivery",
    "DeliveryReport",
    "FileSink",
    "KafkaIdempotentSink",
    "KafkaStreamSink",
    "KafkaTransactionalSink",
    "PartitionProgress",
    "RedisDedupReader",
    "RedisSink",
    "ShardRef",
    "Sink",
]
