"""Read a whole Kafka topic once, to its end: what the operator tools (`dead-letters`, `join
verify`) need, on Apache Kafka and on the embedded broker alike.

Each partition is read from its start to the end a fetch reports (PARTITION_EOF), not to an end
asked for with ListOffsets: a broker may answer that wrongly (the embedded one answers offset 1
for a partition of 1,100 records; see injectors/_kafka_probe.py). Under read_committed a
partition that cannot reach its end (an open transaction) stops when it has been idle.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from millstream.errors import ConfigurationError, TransientError

IDLE_S = 2.0  # a partition that gives nothing for this long is read to its end


def read_to_end(
    kafka: Mapping[str, str],
    topic: str,
    *,
    missing: str = "",
    progress: Callable[[int], None] | None = None,
    idle_s: float = IDLE_S,
) -> Iterator[Any]:
    """Every record of `topic` as a read_committed consumer sees it (confluent-kafka
    messages). A topic that does not exist is a ConfigurationError ending with `missing`."""
    from confluent_kafka import (
        OFFSET_BEGINNING,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    consumer = Consumer(
        {
            **kafka,
            "group.id": f"millstream-tools-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        try:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException as exc:
            raise TransientError(f"Kafka did not answer for topic {topic!r}: {exc}") from None
        if meta is None or meta.error is not None or not meta.partitions:
            raise ConfigurationError(f"topic {topic!r} does not exist{missing}")
        ends = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(ends)])
        last_seen = time.monotonic()
        count = 0
        while ends:
            message = consumer.poll(0.2)
            if message is None:
                if time.monotonic() - last_seen > idle_s:
                    return  # what is left is an open transaction's or was deleted
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    ends.discard(message.partition())
                continue
            last_seen = time.monotonic()
            count += 1
            if progress is not None and count % 10_000 == 0:
                progress(count)
            yield message
    finally:
        consumer.close()
