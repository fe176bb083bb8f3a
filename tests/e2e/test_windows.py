"""Window operators end to end: every window kind in one application (`windows_target`) on
real Spark, Redis and Kafka, with 5% of events sent twice and two SIGKILLs: one at a fault
point (the `sessions` window committed and handed its results over, the collector not yet
run) and one at an arbitrary moment later. Every window's result must equal ground truth
computed here from what was sent, each received exactly once, none late."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state.watermarks import WatermarkAuthority
from millstream.status import committed_counters
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import shard_states
from tests.e2e.sink_faults import ROOT, pipeline_env
from tests.e2e.windows_target import HOPPING, SESSION, SHARDS, TUMBLING

pytestmark = pytest.mark.spark

KEYS = 12
WINDOWS = ("tumbling", "hopping", "sessions", "tumbling_unlifted")

Event = tuple[str, str, int, int]  # id, key, timestamp, n


def _send(producer: Producer, topic: str, rng: random.Random, events: list[Event], n: int) -> None:
    """n events stamped now (up to 800 ms out of order), 5% of them sent twice."""
    now = int(time.time() * 1000)
    fresh = [
        (f"e{i}", f"k{rng.randrange(KEYS)}", now - rng.randrange(800), rng.randrange(10))
        for i in range(len(events), len(events) + n)
    ]
    for event_id, key, ts, value in fresh + rng.sample(fresh, max(1, n // 20)):
        producer.produce(
            topic, key=key, value=json.dumps({"e": event_id, "k": key, "n": value}),
            headers=[("id", event_id.encode())], timestamp=ts, partition=rng.randrange(2),
        )  # fmt: skip
    assert producer.flush(10) == 0
    events.extend(fresh)


def _truth(events: list[Event]) -> dict[str, dict[str, Any]]:
    """Per key, every window's result, by arithmetic (sessions by sorting each key's times)."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    size, every = HOPPING.size_ms, HOPPING.every_ms
    for _, key, ts, n in events:
        start = ts - ts % TUMBLING.size_ms
        for name in ("tumbling_out", "tumbling_unlifted_out"):
            window = f"{name}|{start}|{start + TUMBLING.size_ms}"
            out[key][window] = out[key].get(window, 0) + 1
        for hop in range(ts - ts % every - size + every, ts + 1, every):
            window = f"hopping_out|{hop}|{hop + size}"
            out[key][window] = out[key].get(window, 0) + n
    for key in {k for _, k, _, _ in events}:
        times = sorted(ts for _, k, ts, _ in events if k == key)
        start, end, count = times[0], times[0] + SESSION.gap_ms, 0
        for ts in times:
            if ts >= end:
                out[key][f"sessions_out|{start}|{end}"] = count
                start, count = ts, 0
            end, count = max(end, ts + SESSION.gap_ms), count + 1
        out[key][f"sessions_out|{start}|{end}"] = count
    return dict(out)


def test_every_window_kind_exactly_once_through_two_sigkills(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(2401)
    crash_file = tmp_path / "crash-points"
    base = pipeline_env(redis_url, kafka_bootstrap, app, tmp_path, WINDOWS_TARGET_TOPIC=topic)
    crashing = {
        **base,
        "MILLSTREAM_TEST_CRASH_AT": "fused_after_stage_sessions:2",
        "MILLSTREAM_TEST_CRASH_FILE": str(crash_file),
    }
    pipeline = PipelineProcess.run_target(
        "tests.e2e.windows_target:topology", crashing, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events: list[Event] = []
    authority = WatermarkAuthority(redis_client, app)

    def collected() -> int:
        states = shard_states(redis_client, app, "collector", SHARDS)
        return sum(len(s["windows"]) for s in states.values())

    pipeline.start()
    try:
        # 1. The fault point: sessions committed and handed over, the collector not yet run.
        deadline = time.monotonic() + 240
        while pipeline.alive():
            assert time.monotonic() < deadline, f"no crash:\n{pipeline.log_tail()}"
            _send(producer, topic, rng, events, 30)
            time.sleep(0.5)
        assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
        assert crash_file.read_text().splitlines()[-1] == "CRASH fused_after_stage_sessions 2"
        # 2. Restarted without it, and SIGKILLed again at an arbitrary moment of its work.
        _send(producer, topic, rng, events, 30)
        pipeline.start(base)
        before = collected()
        pipeline.wait_for(lambda: collected() > before, 120, "windows collected after restart")
        for _ in range(4):
            _send(producer, topic, rng, events, 30)
            time.sleep(0.5)
        pipeline.kill9()
        assert pipeline.wait_exit(10) == -9
        # 3. Restarted; more events, then everything closes.
        _send(producer, topic, rng, events, 30)
        pipeline.start(base)
        for _ in range(4):
            _send(producer, topic, rng, events, 30)
            time.sleep(0.5)
        truth = _truth(events)
        expected = sum(len(w) for w in truth.values())
        last_end = max(int(w.split("|")[2]) for windows in truth.values() for w in windows)

        def done() -> bool:
            marks = [authority.published(c) for c in (*WINDOWS, "collector")]
            return collected() >= expected and all(m and m.event > last_end for m in marks)

        pipeline.wait_for(done, 180, f"{expected} window results and every watermark past")
        time.sleep(2.0)  # a (wrong) second emission would land by now
    finally:
        pipeline.stop(30)

    states = shard_states(redis_client, app, "collector", SHARDS)
    assert {k: s["windows"] for k, s in states.items()} == truth
    assert all(s["again"] == [] for s in states.values()), "a window result arrived twice"
    for name in WINDOWS:
        counters = committed_counters(redis_client, app, name, SHARDS)
        assert counters.get("records") == len(events), (name, counters)
        assert counters.get("duplicates", 0) >= 1, (name, counters)  # the 5% resent were seen
        assert counters.get("late", 0) == 0 and counters.get("dead_letters", 0) == 0, counters
        # Open windows only: every window closed and deleted, its timer with it.
        assert shard_states(redis_client, app, name, SHARDS) == {}, name
    lifted = committed_counters(redis_client, app, "tumbling", SHARDS)
    assert lifted.get("window_partials", 0) < lifted["records"], lifted
