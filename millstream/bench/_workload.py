"""The workload every scenario shares: 1,000 Zipf-distributed query keys on 4 input partitions.

Each event is a JSON object `{"q": query, "ts": event time ms, "sent": wall ms at produce}`
with the query as the Kafka key (so a key always lands on the same partition, as Quix Streams'
per-key windows require), the event time as the record's CreateTime and the event id in the
`event-id` header (millstream's record id).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
import zlib
from collections.abc import Mapping

from confluent_kafka import Producer

from millstream.connectors.topics import ensure_topics

QUERIES = 1000
PARTITIONS = 4
ZIPF_S = 1.1
WINDOW_MS = 1000


def query_name(rank: int) -> str:
    return f"q{rank:04d}"


class ZipfKeys:
    """Draws query names with P(rank) proportional to 1 / rank**1.1 (the demo's popularity)."""

    def __init__(self, seed: int = 7, queries: int = QUERIES) -> None:
        self._rng = random.Random(seed)
        self._names = [query_name(r) for r in range(1, queries + 1)]
        weights = [1.0 / (r**ZIPF_S) for r in range(1, queries + 1)]
        total = 0.0
        self._cumulative = []
        for w in weights:
            total += w
            self._cumulative.append(total)

    def draw(self, n: int) -> list[str]:
        return self._rng.choices(self._names, cum_weights=self._cumulative, k=n)


def partition_of(query: str) -> int:
    return zlib.crc32(query.encode()) % PARTITIONS


def new_topic(kafka: Mapping[str, str], prefix: str, partitions: int = PARTITIONS) -> str:
    """A fresh topic with explicit retention (Quix Streams needs it, see INFRA.md)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka, {topic: partitions})
    return topic


def _producer(kafka: Mapping[str, str], linger_ms: int) -> Producer:
    return Producer(
        {
            **kafka,
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        }
    )


def _send(producer: Producer, topic: str, query: str, event_ms: int, sent_ms: int) -> None:
    body = json.dumps({"q": query, "ts": event_ms, "sent": sent_ms}).encode()
    while True:
        try:
            producer.produce(
                topic,
                key=query.encode(),
                value=body,
                partition=partition_of(query),
                timestamp=event_ms,
                headers=[("event-id", uuid.uuid4().bytes)],
            )
            return
        except BufferError:
            producer.poll(0.05)


def preload(
    kafka: Mapping[str, str], topic: str, events: int, *, event_rate: int = 5000, seed: int = 7
) -> dict[str, float]:
    """Write `events` events whose event times advance at `event_rate` per second and end now.

    Returns the producer's rate and the event-time span (so windows are known in advance).
    """
    producer = _producer(kafka, linger_ms=20)
    keys = ZipfKeys(seed).draw(events)
    span_ms = max(1, events * 1000 // event_rate)
    first = int(time.time() * 1000) - span_ms
    started = time.perf_counter()
    for i, query in enumerate(keys):
        event_ms = first + i * 1000 // event_rate
        _send(producer, topic, query, event_ms, event_ms)
        if i % 20_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"preload of {topic}: some events were not acknowledged")
    return {"producer_events_per_s": events / (time.perf_counter() - started), "span_ms": span_ms}


class RateProducer(threading.Thread):
    """Sends Zipf events at a fixed rate for `seconds`, event time = send time, in 5 ms steps."""

    def __init__(
        self, kafka: Mapping[str, str], topic: str, rate: float, seconds: float, seed: int = 11
    ) -> None:
        super().__init__(name=f"rate-{rate:.0f}", daemon=True)
        self.producer = _producer(kafka, linger_ms=1)
        self.topic = topic
        self.rate = rate
        self.seconds = seconds
        self.keys = ZipfKeys(seed)
        self.sent = 0
        self.started_ms = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._play()
        except BaseException as exc:
            self.error = exc

    def _play(self) -> None:
        step = 0.005
        start = time.time()
        self.started_ms = int(start * 1000)
        while not self._halt.is_set():
            elapsed = time.time() - start
            if elapsed >= self.seconds:
                break
            due = int(min(elapsed, self.seconds) * self.rate) - self.sent
            if due > 0:
                now = int(time.time() * 1000)
                for query in self.keys.draw(due):
                    _send(self.producer, self.topic, query, now, now)
                self.sent += due
            self.producer.poll(0)
            time.sleep(step)
        if self.producer.flush(30):
            raise RuntimeError(f"{self.topic}: some events were not acknowledged by Kafka")
