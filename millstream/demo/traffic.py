"""Plays a traffic plan in real time: datacenter 1 into Kafka, datacenter 2 into log files."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from millstream.demo.generator import Plan

ROTATE_EVERY_MS = 20_000


class TrafficPlayer(threading.Thread):
    """Sends each planned event at its planned moment; rotates the log file by renaming it."""

    def __init__(
        self, plan: Plan, start_wall_ms: int, kafka: dict[str, str], topic: str, log_dir: Path
    ):
        super().__init__(name="traffic", daemon=True)
        self.plan = plan
        self.start_wall_ms = start_wall_ms
        self.topic = topic
        self.log_dir = log_dir
        self.producer = Producer({**kafka, "enable.idempotence": True, "linger.ms": 5})
        self.sent = 0
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
        current = self.log_dir / "dc2.log"
        log = current.open("ab")
        rotations = 0
        next_rotation = ROTATE_EVERY_MS
        for event in self.plan.events:
            if self._halt.is_set():
                break
            due = self.start_wall_ms + event.send_ms
            delay = due / 1000 - time.time()
            if delay > 0:
                log.flush()
                self.producer.poll(0)
                time.sleep(delay)
            if event.send_ms >= next_rotation:
                log.close()
                rotations += 1
                current.rename(self.log_dir / f"dc2-{rotations:04d}.log")  # identity survives
                log = current.open("ab")
                next_rotation += ROTATE_EVERY_MS
            event_wall = self.start_wall_ms + event.event_ms
            body = json.dumps({"q": event.query, "ts": event_wall, "id": event.event_id}).encode()
            if event.channel == "kafka":
                self.producer.produce(
                    self.topic,
                    key=event.query.encode(),
                    value=body,
                    timestamp=event_wall,
                    headers=[("event-id", event.event_id.encode())],
                )
            else:
                log.write(body + b"\n")
            self.sent += 1
        log.close()
        remaining = self.producer.flush(30)
        if remaining:
            raise RuntimeError(f"{remaining} events were not acknowledged by Kafka")
