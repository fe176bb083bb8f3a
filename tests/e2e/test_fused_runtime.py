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
