"""The fused runtime's own crash window: after the consumers committed, before any ack.

`tests/e2e/holds_target.py` (windower -> collector) runs as `millstream run` with
One streaming query; the windower's window counts are handed to the
collector inside each micro-batch, never through Kafka. A test-only fault point SIGKILLs every
process of the pipeline in a batch that handed productions over, right after the collector
committed them and before the windower's checkpoints were acknowledged. Restarted, the windower
finds those checkpoints pending and hands them over again; the collector must drop them as
replays (same production id, same position), so every window reaches it exactly once (ground
truth computed here from what was sent) and no checkpoint is left behind.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state.keys import ShardKeys
from millstream.state.watermarks import WatermarkAuthority
from millstream.status import committed_counters
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import shard_states
from tests.e2e.holds_target import SHARDS, WINDOW_MS
from tests.e2e.sink_faults import ROOT, pipeline_env
from tests.e2e.test_timestamp_contract import _send, _truth

pytestmark = pytest.mark.spark

CRASH_ON = 2  # the second batch that hands window counts over


def test_sigkill_after_consumers_commit_before_acknowledgement(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    import random

    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1601)
    crash_file = tmp_path / "crash-points"
    base = pipeline_env(
        redis_url,
        kafka_bootstrap,
        app,
        tmp_path,
        HOLDS_TARGET_TOPIC=topic,
        HOLDS_TARGET_HOLD="1",
    )
    crashing = {
        **base,
        "MILLSTREAM_TEST_CRASH_AT": f"fused_after_consumers_commit:{CRASH_ON}",
        "MILLSTREAM_TEST_CRASH_FILE": str(crash_file),
    }
    pipeline = PipelineProcess.run_target(
        "tests.e2e.holds_target:topology", crashing, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events: list[tuple[str, str, int]] = []
    authority = WatermarkAuthority(redis_client, app)
    pipeline.start()
    try:
        deadline = time.monotonic() + 240
        while pipeline.alive():
            assert time.monotonic() < deadline, f"no crash:\n{pipeline.log_tail()}"
            events += _send(producer, topic, rng, len(events), 30)
            time.sleep(1.0)
        assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
        hits = crash_file.read_text().splitlines()
        assert hits[-1] == f"CRASH fused_after_consumers_commit {CRASH_ON}", hits
        stranded = sum(
            redis_client.hlen(ShardKeys(app, "windower", s).productions) for s in range(SHARDS)
        )
        assert stranded, "the crash left no handed-over checkpoint unacknowledged"
        applied = committed_counters(redis_client, app, "collector", SHARDS).get("records", 0)
        assert applied, "the collector committed nothing before the crash"

        events += _send(producer, topic, rng, len(events), 30)
        truth = _truth(events)
        expected = sum(len(w) for w in truth.values())
        last_end = max(int(w) for windows in truth.values() for w in windows) + WINDOW_MS

        def collected() -> int:
            states = shard_states(redis_client, app, "collector", SHARDS)
            return sum(len(s["windows"]) for s in states.values())

        def done() -> bool:
            marks = [authority.published(c) for c in ("windower", "collector")]
            return collected() >= expected and all(m and m.event > last_end for m in marks)

        pipeline.start(base)  # no crash point this time
        pipeline.wait_for(done, 180, f"{expected} windows at stage 2 and both watermarks past")
        time.sleep(2.0)  # a (wrong) extra hand-over would land by now
    finally:
        pipeline.stop(30)

    states = shard_states(redis_client, app, "collector", SHARDS)
    assert {k: s["windows"] for k, s in states.items()} == truth
    assert all(s["again"] == [] for s in states.values()), "a window reached stage 2 twice"
    collector = committed_counters(redis_client, app, "collector", SHARDS)
    windower = committed_counters(redis_client, app, "windower", SHARDS)
    assert collector.get("records") == expected
    # The stranded checkpoints came again and were dropped by id and position, not re-applied.
    assert collector.get("replays", 0) >= 1, collector
    assert windower.get("records") == len(events)
    assert windower.get("timers_fired") == expected
    for counters in (windower, collector):
        assert counters.get("late", 0) == 0 and counters.get("dead_letters", 0) == 0, counters
    left = sum(redis_client.hlen(ShardKeys(app, "windower", s).productions) for s in range(SHARDS))
    assert left == 0, f"{left} checkpoints never acknowledged"
    # Nothing between the two computations went through Kafka.
    listed = producer.list_topics(timeout=10).topics
    assert f"{app}.windows" not in listed


def _send_chain(
    producer: Producer, topic: str, rng: Any, events: list[tuple[str, str]], n: int
) -> None:
    """n more events for tests.e2e.chain_target, appended to `events` (id, key)."""
    import json

    for i in range(len(events), len(events) + n):
        key = f"k{rng.randrange(6)}"
        events.append((f"e{i}", key))
        producer.produce(
            topic, key=key, value=json.dumps({"e": f"e{i}", "k": key}),
            headers=[("id", f"e{i}".encode())], partition=rng.randrange(2),
        )  # fmt: skip
    assert producer.flush(10) == 0


def _collected(client: Any, app: str) -> int:
    from tests.e2e.chain_target import SHARDS as CHAIN_SHARDS

    states = shard_states(client, app, "collector", CHAIN_SHARDS)
    return sum(len(s["events"]) for s in states.values())


def test_sigkill_in_the_middle_of_a_three_stage_batch(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    """count -> relay -> collector in one query; SIGKILL after `relay` committed (its input
    handed over by `count` in the same batch) and before `collector` ran. Restarted, `count`'s
    pending checkpoints reach `relay` again (dropped as replays) and `relay`'s reach `collector`
    for the first time: every event at every stage exactly once, against ground truth."""
    import random
    from collections import Counter

    from tests.e2e.chain_target import SHARDS as CHAIN_SHARDS

    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1603)
    crash_file = tmp_path / "crash-points"
    base = pipeline_env(redis_url, kafka_bootstrap, app, tmp_path, CHAIN_TARGET_TOPIC=topic)
    crashing = {
        **base,
        "MILLSTREAM_TEST_CRASH_AT": "fused_after_stage_relay:2",
        "MILLSTREAM_TEST_CRASH_FILE": str(crash_file),
    }
    pipeline = PipelineProcess.run_target(
        "tests.e2e.chain_target:topology", crashing, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events: list[tuple[str, str]] = []

    def send(n: int) -> None:
        _send_chain(producer, topic, rng, events, n)

    def collected() -> int:
        return _collected(redis_client, app)

    pipeline.start()
    try:
        deadline = time.monotonic() + 240
        while pipeline.alive():
            assert time.monotonic() < deadline, f"no crash:\n{pipeline.log_tail()}"
            send(20)
            time.sleep(1.0)
        assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
        hits = crash_file.read_text().splitlines()
        assert hits[-1] == "CRASH fused_after_stage_relay 2", hits
        relay_pending = sum(
            redis_client.hlen(ShardKeys(app, "relay", s).productions) for s in range(CHAIN_SHARDS)
        )
        assert relay_pending, "relay's productions of the killed batch are not checkpointed"
        send(40)
        pipeline.start(base)  # no crash point this time
        pipeline.wait_for(lambda: collected() >= len(events), 180, f"{len(events)} collected")
        time.sleep(2.0)  # a (wrong) extra hand-over would land by now
    finally:
        pipeline.stop(30)

    truth = Counter(key for _, key in events)
    counts = shard_states(redis_client, app, "count", CHAIN_SHARDS)
    assert counts == dict(truth)
    states = shard_states(redis_client, app, "collector", CHAIN_SHARDS)
    assert all(s["again"] == [] for s in states.values()), "an event reached collector twice"
    assert {k: sorted(s["events"]) for k, s in states.items()} == {
        k: sorted(e for e, key in events if key == k) for k in truth
    }
    relay = committed_counters(redis_client, app, "relay", CHAIN_SHARDS)
    assert relay.get("records") == len(events), relay
    assert relay.get("replays", 0) >= 1, relay  # count's checkpoints came again, dropped
    for comp in ("count", "relay"):
        left = sum(redis_client.hlen(ShardKeys(app, comp, s).productions) for s in range(SHARDS))
        assert left == 0, f"{comp}: {left} checkpoints never acknowledged"


def test_a_spark_task_retry_of_a_consumer_stage_applies_nothing_twice(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    """count -> relay -> collector with shard work in Spark tasks and a master that retries
    tasks (local[2,2]). One of relay's shard tasks dies right after its commit (its Python
    worker exits): Spark runs the task again in the same batch, which finds its records
    applied (replays) and returns the committed productions for the hand-over. No query
    restart; every event at every stage exactly once, against ground truth."""
    import random
    from collections import Counter

    from tests.e2e.chain_target import SHARDS as CHAIN_SHARDS

    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1604)
    marker = tmp_path / "task-retried"
    env = pipeline_env(
        redis_url,
        kafka_bootstrap,
        app,
        tmp_path,
        CHAIN_TARGET_TOPIC=topic,
        MILLSTREAM_SPARK_MASTER="local[2,2]",
        MILLSTREAM_SMALL_BATCH_ROWS="0",
        MILLSTREAM_QUERY_RESTARTS="0",
        MILLSTREAM_TEST_FAULT_HOOK="tests.e2e.task_retry_hook:hook",
        TASK_RETRY_COMPUTATION="relay",
        TASK_RETRY_MARKER=str(marker),
    )
    pipeline = PipelineProcess.run_target(
        "tests.e2e.chain_target:topology", env, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events: list[tuple[str, str]] = []
    _send_chain(producer, topic, rng, events, 300)

    def collected() -> int:
        return _collected(redis_client, app)

    pipeline.start()
    try:
        pipeline.wait_for(lambda: collected() >= len(events), 240, f"{len(events)} collected")
        time.sleep(2.0)  # a (wrong) extra hand-over would land by now
        assert pipeline.alive(), pipeline.log_tail()  # no query failure: the task was retried
    finally:
        pipeline.stop(30)
    assert marker.exists(), "no relay task died after its commit"

    truth = Counter(key for _, key in events)
    assert shard_states(redis_client, app, "count", CHAIN_SHARDS) == dict(truth)
    states = shard_states(redis_client, app, "collector", CHAIN_SHARDS)
    assert all(s["again"] == [] for s in states.values()), "an event reached collector twice"
    assert sum(len(s["events"]) for s in states.values()) == len(events)
    relay = committed_counters(redis_client, app, "relay", CHAIN_SHARDS)
    assert relay.get("records") == len(events), relay
    assert relay.get("replays", 0) >= 1, relay  # the retry found the dead attempt's records
