"""The Photon demo's traffic and its observer.

Traffic: one query per click (the search that showed the clicked ad). Most queries are sent
just before their click; a share is sent late (a few seconds to `max_delay_s` after it, so the
click waits and retries); a share never (the click goes unjoined after the give-up time); a
share of clicks is sent twice (a retrying producer: the same record id), and a smaller share
again under a new record id (the same click logged twice: only the registry can tell).

The observer reads both pipelines' joined output as it arrives and, every 0.5 s, counts the
clicks output more than once (by distinct production id, as a consumer deduplicates): Photon's
at-most-once property, checked at every moment rather than at the end.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from millstream.headers import HEADER_ID
from millstream.state.watermarks import now_ms

SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class Send:
    at_ms: int  # offset from the start of traffic
    topic: str  # "clicks" or "queries"
    id: str  # the record id (event-id header)
    value: dict[str, Any]


@dataclass
class PhotonPlan:
    sends: list[Send]
    fates: dict[str, str]  # click id -> "on_time" | "late" | "never"
    duration_ms: int
    joined: dict[str, dict[str, Any]]  # click id -> what its joined output must say


def plan_traffic(
    duration_s: float, rate: float, seed: int, max_delay_s: float, late: float, never: float,
    duplicates: float,
) -> PhotonPlan:  # fmt: skip
    rng = random.Random(seed)
    sends: list[Send] = []
    fates: dict[str, str] = {}
    joined: dict[str, dict[str, Any]] = {}
    for i in range(int(duration_s * rate)):
        at = int(i * 1000 / rate)
        click, query = f"c{i}", f"q{i}"
        fate = rng.choices(["on_time", "late", "never"], [1 - late - never, late, never])[0]
        fates[click] = fate
        shown = {"query_id": query, "terms": f"terms {rng.randrange(500)}"}
        if fate == "on_time":
            sends.append(Send(max(0, at - rng.randrange(50, 300)), "queries", query, shown))
        elif fate == "late":
            delay = int(rng.uniform(1.0, max_delay_s) * 1000)
            sends.append(Send(at + delay, "queries", query, shown))
        body = {"click_id": click, "query_id": query, "ad": f"ad{rng.randrange(50)}"}
        joined[click] = {"click": click, "query": query, "terms": shown["terms"], "ad": body["ad"]}
        sends.append(Send(at, "clicks", click, body))
        if rng.random() < duplicates:  # a producer's retry: the same record id
            sends.append(Send(at + rng.randrange(10, 2000), "clicks", click, body))
        if rng.random() < duplicates / 2:  # the same click logged twice: a new record id
            sends.append(Send(at + rng.randrange(10, 2000), "clicks", f"{click}-again", body))
    sends.sort(key=lambda s: s.at_ms)
    return PhotonPlan(sends, fates, int(duration_s * 1000), joined)


class Player(threading.Thread):
    """Sends the plan on time: each record stamped with its send time (its event time)."""

    def __init__(self, plan: PhotonPlan, start_ms: int, kafka: Mapping[str, str],
                 topics: Mapping[str, str]) -> None:  # fmt: skip
        super().__init__(name="photon-traffic", daemon=True)
        self.plan, self.start_ms, self.kafka, self.topics = plan, start_ms, dict(kafka), topics
        self.sent_clicks: dict[str, int] = {}  # click id -> first send, wall ms
        self.sent = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({**self.kafka, "linger.ms": 5, "enable.idempotence": True})
        try:
            for send in self.plan.sends:
                if self._halt.is_set():
                    break
                due = self.start_ms + send.at_ms
                wait = (due - now_ms()) / 1000
                if wait > 0:
                    time.sleep(wait)
                now = now_ms()
                producer.produce(
                    self.topics[send.topic], value=json.dumps(send.value).encode(),
                    headers=[("event-id", send.id.encode())], timestamp=now,
                )  # fmt: skip
                producer.poll(0)
                if send.topic == "clicks":
                    self.sent_clicks.setdefault(send.id, now)
                self.sent += 1
            if producer.flush(30) != 0:
                raise RuntimeError("the traffic producer could not deliver everything")
        except BaseException as exc:  # reported by the demo
            self.error = exc

    def stop(self) -> None:
        self._halt.set()


@dataclass
class Observed:
    first_seen: dict[str, tuple[int, str]] = field(default_factory=dict)  # click -> (ms, app)
    outputs: dict[str, set[bytes]] = field(default_factory=dict)  # click -> production ids
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)  # click -> first output
    samples: list[dict[str, Any]] = field(default_factory=list)  # every 0.5 s


class OutputWatcher(threading.Thread):
    """Reads both pipelines' joined topics as they grow; samples at-most-once every 0.5 s."""

    def __init__(self, kafka: Mapping[str, str], topics: Mapping[str, str]) -> None:
        super().__init__(name="photon-watcher", daemon=True)
        self.kafka, self.topics = dict(kafka), dict(topics)  # app -> topic
        self.seen = Observed()
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {**self.kafka, "group.id": f"photon-demo-{uuid.uuid4().hex}",
             "auto.offset.reset": "earliest", "enable.auto.commit": False,
             "fetch.wait.max.ms": 50, "topic.metadata.refresh.interval.ms": 1000}
        )  # fmt: skip
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        app_of = {topic: app for app, topic in self.topics.items()}
        parts = []
        for topic in self.topics.values():  # assigned, not subscribed: no rebalance to wait for
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        consumer.assign(parts)
        next_sample = time.monotonic()
        try:
            while not self._halt.is_set():
                for message in consumer.consume(500, 0.1):
                    if message.error() is not None:
                        continue
                    click = (message.key() or b"").decode()
                    raw = dict(message.headers() or []).get(HEADER_ID) or b""
                    pid = raw if isinstance(raw, bytes) else raw.encode()
                    app = app_of[message.topic() or ""]
                    with self._lock:
                        self.seen.outputs.setdefault(click, set()).add(pid)
                        self.seen.first_seen.setdefault(click, (now_ms(), app))
                        self.seen.bodies.setdefault(click, json.loads(message.value() or b"{}"))
                if time.monotonic() >= next_sample:
                    next_sample += SAMPLE_EVERY_S
                    self._sample()
        finally:
            consumer.close()

    def _sample(self) -> None:
        with self._lock:
            twice = sum(1 for ids in self.seen.outputs.values() if len(ids) > 1)
            per_app: dict[str, int] = {}
            for _, app in self.seen.first_seen.values():
                per_app[app] = per_app.get(app, 0) + 1
            self.seen.samples.append({"t": now_ms(), "violations": twice, "joined": per_app})

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
