"""The produce loop both Kafka sinks use: one record into the producer's queue, bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from millstream.headers import production_headers
from millstream.records import Production
from millstream.sinks._kafka import Deadline
from millstream.sinks.base import BackpressureError

_POLL_S = 0.05


def produce(
    producer: Producer,
    topic: str,
    production: Production,
    on_delivery: Callable[[KafkaError | None, Message], Any],
    deadline: Deadline,
    *,
    queue_full: str,
    failed: Callable[[BaseException], NoReturn],
    poll_failed: Callable[[BaseException], NoReturn] | None = None,
) -> None:
    """Enqueue one record (key, value, event time, the `millstream.headers` headers).

    While librdkafka's local queue is full (BufferError), serve delivery reports (poll) until
    there is room; at `deadline` raise BackpressureError saying `queue_full`. A KafkaException
    from produce goes to `failed`, which raises the sink's error for it; one from poll goes to
    `poll_failed` if given, else propagates.
    """
    while True:
        try:
            producer.produce(
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
                raise BackpressureError(queue_full) from None
            try:
                producer.poll(_POLL_S)
            except (KafkaException, SystemError) as exc:
                if poll_failed is None:
                    raise
                poll_failed(exc)
        except KafkaException as exc:
            failed(exc)
