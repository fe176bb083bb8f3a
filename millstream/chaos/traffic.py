"""Steady input for the chaos run: numbered events at a fixed rate, with holds (the delay fault)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from millstream.chaos.pipeline import ID_HEADER
from millstream.testing.faults import SentRecord


class EventSender(threading.Thread):
    """Sends `rate` events per second; a hold stops sending, and the backlog follows in a burst.

    Acknowledged records are kept so the duplicate fault can send some again unchanged. The
    producer waits out broker restarts (5-minute delivery timeout) instead of dropping events.
    """

    def __init__(
        self, kafka: dict[str, str], topic: str, app: str, rate: float, keys: int, seed: int
    ):
        super().__init__(name="chaos-traffic", daemon=True)
        self.topic = topic
        self.app = app
        self.rate = rate
        self.keys = keys
        self.rng = random.Random(seed)
        self.producer = Producer(
            {**kafka, "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 300_000}
        )
        self.sent = 0
        self.acked: list[SentRecord] = []
        self.failed: list[str] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._held_until = 0.0

    def hold(self, seconds: float) -> None:
        self._held_until = time.monotonic() + seconds

    def stop(self) -> None:
        self._halt.set()

    def sample_acked(self, count: int, rng: random.Random) -> list[SentRecord]:
        with self._lock:
            return rng.sample(self.acked, min(count, len(self.acked)))

    def run(self) -> None:
        try:
            self._send()
        except BaseException as exc:
            self.error = exc

    def _send(self) -> None:
        started = time.monotonic()
        while not self._halt.is_set():
            if time.monotonic() < self._held_until:
                self.producer.poll(0.05)
                continue
            due = started + self.sent / self.rate
            wait = due - time.monotonic()
            if wait > 0:
                self.producer.poll(min(wait, 0.05))
                continue
            self._produce_one()
        remaining = self.producer.flush(300)
        if remaining:
            raise RuntimeError(f"{remaining} events were never acknowledged by the broker")

    def _produce_one(self) -> None:
        event_id = f"{self.app}-{self.sent:07d}"
        key = f"k{int(self.rng.paretovariate(1.2)) % self.keys:03d}"
        record = SentRecord(
            key=key.encode(),
            value=json.dumps({"id": event_id, "k": key}).encode(),
            timestamp_ms=int(time.time() * 1000),
            headers=((ID_HEADER, event_id.encode()),),
        )
        self.producer.produce(
            self.topic,
            key=record.key,
            value=record.value,
            timestamp=record.timestamp_ms,
            headers=list(record.headers),
            on_delivery=self._on_delivery(record),
        )
        self.sent += 1
        self.producer.poll(0)

    def _on_delivery(self, record: SentRecord) -> Callable[[Any, Any], None]:
        return lambda err, _msg: self._delivered(err, record)

    def _delivered(self, err: Any, record: SentRecord) -> None:
        with self._lock:
            if err is None:
                self.acked.append(record)
            else:  # still checked: ground truth is read back from the topic, not taken from here
                self.failed.append(str(err))
