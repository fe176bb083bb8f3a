"""What the demo watches while it runs: watermark lag per stage and result latency."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from millstream.state.watermarks import UNKNOWN, WatermarkAuthority, now_ms

STAGES = ("window_counter", "model_calculator", "spike_detector", "dip_detector")


class WatermarkSampler(threading.Thread):
    """Samples each stage's published low watermark once per second (the paper's Figure 15)."""

    def __init__(self, client: Any, app: str, stages: tuple[str, ...] = STAGES) -> None:
        super().__init__(name="wm-sampler", daemon=True)
        self.authority = WatermarkAuthority(client, app)
        self.stages = stages
        self.samples: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def latest(self, stage: str) -> int | None:
        wm = self.authority.published(stage)
        return wm.event if wm is not None and wm.event > UNKNOWN else None

    def run(self) -> None:
        while not self._halt.wait(1.0):
            try:
                now = now_ms()
                sample: dict[str, Any] = {"t": now}
                for stage in self.stages:
                    wm = self.latest(stage)
                    sample[stage] = None if wm is None else now - wm
                self.samples.append(sample)
            except Exception:
                continue


class ResultWatcher(threading.Thread):
    """Notes when each window count first becomes visible to a read_committed consumer."""

    def __init__(self, kafka: dict[str, str], topic: str, partitions: int) -> None:
        super().__init__(name="result-watcher", daemon=True)
        self.consumer = Consumer(
            {
                **kafka,
                "group.id": f"demo-watch-{topic}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.first_seen: dict[tuple[str, int], int] = {}
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                message = self.consumer.poll(0.2)
                if message is None or message.error():
                    continue
                seen = time.time_ns() // 1_000_000
                item = json.loads(message.value() or b"{}")
                self.first_seen.setdefault((item["key"], item["start"]), seen)
        finally:
            self.consumer.close()
