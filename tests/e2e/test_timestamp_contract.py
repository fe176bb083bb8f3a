"""The timestamp contract end to end: a window result stamped at the window's start.

`tests/e2e/holds_target.py`: windower (1-second windows, low-watermark timers) -> collector.
The windower produces each window's count stamped at the window's start, earlier than the
timer that produces it.

- With a watermark hold at the window's start, run as `millstream run` and SIGKILLed mid-run
  (driver, JVM and workers) then restarted: the collector ends with every window's count
  exactly once (ground truth computed here from what was sent, duplicates included), and no
  record is late or dead-lettered at either stage.
- Without the hold, every such production breaks the contract: each window becomes a dead
  letter naming the contract, and the collector sees nothing late, because nothing was
  silently dropped as late.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state.watermarks import WatermarkAuthority
from millstream.status import committed_counters
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import read_topic, shard_states, wait_until
from tests.e2e.holds_target import SHARDS, WINDOW_MS, build
from tests.e2e.sink_faults import ROOT, pipeline_env

pytestmark = pytest.mark.spark

KEYS = 6


def _send(
    producer: Producer, topic: str, rng: random.Random, first: int, n: int
) -> list[tuple[str, str, int]]:
    """n events stamped now (a little out of order), 5% of them sent twice; returns them."""
    now = int(time.time() * 1000)
    events = [(f"e{i}", f"k{rng.randrange(KEYS)}", now - rng.randrange(800)) for i in range(first, first + n)]  # fmt: skip
    for event_id, key, ts in events + rng.sample(events, max(1, n // 20)):
        producer.produce(
            topic,
            key=key,
            value=json.dumps({"e": event_id, "k": key}),
            headers=[("id", event_id.encode())],
            timestamp=ts,
            partition=rng.randrange(2),
        )
    assert producer.flush(10) == 0
    return events


def _truth(events: list[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    counts = Counter((key, ts - ts % WINDOW_MS) for _, key, ts in events)
    out: dict[str, dict[str, int]] = {}
    for (key, start), n in counts.items():
        out.setdefault(key, {})[str(start)] = n
    return out


def test_hold_keeps_stage_two_on_time_through_a_sigkill(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1505)
    env = pipeline_env(
        redis_url, kafka_bootstrap, app, tmp_path, HOLDS_TARGET_TOPIC=topic, HOLDS_TARGET_HOLD="1"
    )
    pipeline = PipelineProcess.run_target(
        "tests.e2e.holds_target:topology", env, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events: list[tuple[str, str, int]] = []

    def collected() -> int:
        states = shard_states(redis_client, app, "collector", SHARDS)
        return sum(len(s["windows"]) for s in states.values())

    pipeline.start()
    try:
        for wave in range(6):
            events += _send(producer, topic, rng, len(events), 40)
            time.sleep(1.0)
            if wave == 0:
                pipeline.wait_for(lambda: collected() > 0, 180, "the first window at stage 2")
        pipeline.kill9()
        deadline = time.monotonic() + 10
        while pipeline.members() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pipeline.members() == [], "a process of the pipeline survived the SIGKILL"
        before = collected()
        for _ in range(4):  # more input while it is down
            events += _send(producer, topic, rng, len(events), 40)
            time.sleep(0.5)
        pipeline.start()
        truth = _truth(events)
        expected = sum(len(w) for w in truth.values())
        last_end = max(int(w) for windows in truth.values() for w in windows) + WINDOW_MS
        authority = WatermarkAuthority(redis_client, app)

        def done() -> bool:
            marks = [authority.published(c) for c in ("windower", "collector")]
            return collected() >= expected and all(m and m.event > last_end for m in marks)

        pipeline.wait_for(done, 180, f"{expected} windows at stage 2 and both watermarks past")
        time.sleep(2.0)  # any (wrong) extra delivery lands before the exact comparison
    finally:
        pipeline.stop(30)

    assert 0 < before < expected, "the SIGKILL did not come mid-run"
    states = shard_states(redis_client, app, "collector", SHARDS)
    assert {k: s["windows"] for k, s in states.items()} == truth
    assert all(s["again"] == [] for s in states.values()), "a window reached stage 2 twice"
    windower = committed_counters(redis_client, app, "windower", SHARDS)
    collector = committed_counters(redis_client, app, "collector", SHARDS)
    assert windower.get("records") == len(events)
    assert windower.get("late", 0) == 0
    assert windower.get("timers_fired") == expected
    assert collector.get("records") == expected
    assert collector.get("late", 0) == 0, "a production stamped at its hold arrived late"
    assert windower.get("dead_letters", 0) == collector.get("dead_letters", 0) == 0


def test_without_the_hold_the_contract_dead_letters_each_window(
    start_app: Any,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
) -> None:
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1506)
    app = start_app(build(app_name, topic, hold=False), shards=SHARDS, user_retries=0)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events = _send(producer, topic, rng, 0, 60)
    time.sleep(1.0)
    events += _send(producer, topic, rng, 60, 60)
    truth = _truth(events)
    expected = sum(len(w) for w in truth.values())

    def windower() -> dict[str, int]:
        return committed_counters(redis_client, app_name, "windower", SHARDS)

    wait_until(
        lambda: windower().get("dead_letters", 0) >= expected,
        120,
        f"{expected} windows dead-lettered by the windower",
        app,
    )
    letters = read_topic(kafka_bootstrap, f"{app_name}.dead-letters", expected=expected)
    bodies = [json.loads(m.value()) for m in letters]
    assert len(bodies) == expected
    assert {(b["key"], str(b["timer"]["tag"])) for b in bodies} == {
        (key, start) for key, windows in truth.items() for start in windows
    }
    for body in bodies:
        assert body["computation"] == "windower"
        assert "TimestampContractError" in body["error"], body
        assert "earlier than its cause" in body["error"] and "hold=" in body["error"], body
    collector = committed_counters(redis_client, app_name, "collector", SHARDS)
    assert collector.get("records", 0) == 0
    assert collector.get("late", 0) == 0, "a window result was dropped as late, silently"
    assert windower().get("records") == len(events)
    assert windower().get("timers_fired", 0) == 0
