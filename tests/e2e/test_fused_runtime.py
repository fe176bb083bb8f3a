"""The fused runtime's own fault windows, in turn on one pipeline, each checked where it happens.

`tests/e2e/fused_target.py` runs as `millstream run`: one streaming query with two branches,
each fed by a topic of its own, so a phase drives one branch alone. Windows: `windower` hands
its window counts (produced by low-watermark timers) to `collector`; chain: `count` -> `relay`
-> `chain_collector`. Every hand-over happens inside the micro-batch, never through Kafka. The
pipeline is started three times, from the same Spark checkpoints and Redis state:

1. Windows fed, a test-only fault point SIGKILLs every process of the pipeline in the second
   batch that handed window counts over, right after `collector` committed them and before
   `windower`'s checkpoints were acknowledged (`fused_after_consumers_commit`). Checked there:
   the crash mark, every process gone, checkpoints stranded, `collector` had committed.
2. Restarted with the next point armed: `windower` finds its checkpoints pending and hands them
   over again (`collector` drops them as replays: same production id, same position). The
   chain fed, the pipeline is SIGKILLed in the middle of a three-stage batch: `relay` committed
   its input (handed over by `count` in the same batch) and `chain_collector` has not run
   (`fused_after_stage_relay`). Checked there: the mark, every process gone, `relay`'s
   productions checkpointed. The chain's input carries no id header: `count`'s records are
   known by their Kafka position, and the re-run batch finds them below its offset marks.
3. Restarted without a crash point, shard work in Spark tasks and a master that retries tasks
   (`local[2,2]`, no query restarts): `count`'s stranded checkpoints reach `relay` again
   (dropped as replays, counted once nothing is pending), `relay`'s reach `chain_collector`
   for the first time; every window closes.
4. On the same run a task retry is armed (`tests/e2e/task_retry_hook.py`): one of `relay`'s
   shard tasks dies right after its commit (its Python worker exits), Spark runs it again in
   the same batch, which finds its records applied (replays beyond those of step 3) and returns
   the committed productions for the hand-over, without a query failure.

At the end every window and every event reaches each stage exactly once (ground truth computed
here from what was sent) and no checkpoint is left behind.
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

from millstream.state.keys import ShardKeys
from millstream.state.watermarks import WatermarkAuthority
from millstream.status import committed_counters
from millstream.testing.process import PipelineProcess
from tests.e2e.chain_target import SHARDS as CHAIN_SHARDS
from tests.e2e.conftest import shard_states
from tests.e2e.fused_target import CHAIN_COLLECTOR
from tests.e2e.holds_target import SHARDS, WINDOW_MS
from tests.e2e.sink_faults import ROOT, Phases, pipeline_env
from tests.e2e.test_timestamp_contract import _send, _truth

pytestmark = pytest.mark.spark

CRASH_ON = 2  # the second batch that reaches the point: after a clean one
RETRY_EVENTS = 300  # sent at once once the task retry is armed


def _send_chain(
    producer: Producer, topic: str, rng: random.Random, events: list[tuple[str, str]], n: int
) -> None:
    """n more events for the chain, appended to `events` (id, key)."""
    for i in range(len(events), len(events) + n):
        key = f"k{rng.randrange(6)}"
        events.append((f"c{i}", key))
        producer.produce(
            topic, key=key, value=json.dumps({"e": f"c{i}", "k": key}),
            headers=[("id", f"c{i}".encode())], partition=rng.randrange(2),
        )  # fmt: skip
    assert producer.flush(10) == 0


def _pending(client: Any, app: str, computation: str, shards: int) -> int:
    """Checkpointed productions of a computation not acknowledged yet."""
    return sum(client.hlen(ShardKeys(app, computation, s).productions) for s in range(shards))


def _crash_until_dead(pipeline: PipelineProcess, point: str, crash_file: Path, feed: Any) -> None:
    """Feed the pipeline once a second until the crash point kills it; check it was that."""
    deadline = time.monotonic() + 240
    while pipeline.alive():
        assert time.monotonic() < deadline, f"no crash at {point}:\n{pipeline.log_tail()}"
        feed()
        time.sleep(1.0)
    assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
    assert pipeline.members() == [], f"a process of the pipeline survived the crash at {point}"
    hits = crash_file.read_text().splitlines()
    assert hits[-1] == f"CRASH {point} {CRASH_ON}", hits


def test_crashes_in_a_fused_batch_and_a_task_retry_apply_nothing_twice(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    windows_topic = kafka_topic_factory(partitions=2)
    chain_topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1601)
    base = pipeline_env(
        redis_url,
        kafka_bootstrap,
        app,
        tmp_path,
        FUSED_TARGET_WINDOWS_TOPIC=windows_topic,
        FUSED_TARGET_CHAIN_TOPIC=chain_topic,
    )

    def crashing(point: str) -> dict[str, str]:
        return {
            **base,
            "MILLSTREAM_TEST_CRASH_AT": f"{point}:{CRASH_ON}",
            "MILLSTREAM_TEST_CRASH_FILE": str(tmp_path / f"crash-points-{point}"),
        }

    marker = tmp_path / "task-retried"
    armed = tmp_path / "task-retry-armed"
    retrying = {
        **base,
        "MILLSTREAM_SPARK_MASTER": "local[2,2]",
        "MILLSTREAM_SMALL_BATCH_ROWS": "0",
        "MILLSTREAM_QUERY_RESTARTS": "0",
        "MILLSTREAM_TEST_FAULT_HOOK": "tests.e2e.task_retry_hook:hook",
        "TASK_RETRY_COMPUTATION": "relay",
        "TASK_RETRY_MARKER": str(marker),
        "TASK_RETRY_ARM": str(armed),
    }
    pipeline = PipelineProcess.run_target(
        "tests.e2e.fused_target:topology", base, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    windows: list[tuple[str, str, int]] = []  # (id, key, timestamp)
    chain: list[tuple[str, str]] = []  # (id, key)
    authority = WatermarkAuthority(redis_client, app)

    def send_windows(n: int) -> None:
        windows.extend(_send(producer, windows_topic, rng, len(windows), n))

    def chain_collected() -> int:
        states = shard_states(redis_client, app, CHAIN_COLLECTOR, CHAIN_SHARDS)
        return sum(len(s["events"]) for s in states.values())

    phase = Phases()
    try:
        # 1. Windows only (the chain idle): every batch that hands over hands window counts.
        point = "fused_after_consumers_commit"
        pipeline.start(crashing(point))
        _crash_until_dead(
            pipeline, point, tmp_path / f"crash-points-{point}", lambda: send_windows(30)
        )
        phase(f"crashed at {point}")
        assert _pending(redis_client, app, "windower", SHARDS), (
            "the crash left no handed-over checkpoint unacknowledged"
        )
        applied = committed_counters(redis_client, app, "collector", SHARDS).get("records", 0)
        assert applied, "the collector committed nothing before the crash"
        fed = committed_counters(redis_client, app, "count", CHAIN_SHARDS).get("records", 0)
        assert fed == 0, "the chain was fed before its phase"

        # 2. The last windows, then the chain: SIGKILL after relay committed, collector not run.
        send_windows(30)
        point = "fused_after_stage_relay"
        pipeline.start(crashing(point))
        _crash_until_dead(
            pipeline,
            point,
            tmp_path / f"crash-points-{point}",
            lambda: _send_chain(producer, chain_topic, rng, chain, 20),
        )
        phase(f"crashed at {point}")
        assert _pending(redis_client, app, "relay", CHAIN_SHARDS), (
            "relay's productions of the killed batch are not checkpointed"
        )

        # 3. Restarted without a crash point, shard work in Spark tasks that Spark may retry.
        _send_chain(producer, chain_topic, rng, chain, 40)
        truth = _truth(windows)
        expected = sum(len(w) for w in truth.values())
        last_end = max(int(w) for ws in truth.values() for w in ws) + WINDOW_MS

        def windows_collected() -> int:
            states = shard_states(redis_client, app, "collector", SHARDS)
            return sum(len(s["windows"]) for s in states.values())

        def windows_closed() -> bool:
            marks = [authority.published(c) for c in ("windower", "collector")]
            return windows_collected() >= expected and all(m and m.event > last_end for m in marks)

        def chain_settled() -> bool:
            stranded = (_pending(redis_client, app, c, CHAIN_SHARDS) for c in ("count", "relay"))
            return chain_collected() >= len(chain) and not any(stranded)

        pipeline.start(retrying)
        pipeline.wait_for(chain_settled, 180, f"{len(chain)} events collected, none pending")
        phase("chain settled")
        pipeline.wait_for(windows_closed, 180, f"{expected} windows, both watermarks past")
        phase("windows closed")
        # count's stranded checkpoints came again and were dropped by relay, not re-applied
        # (counted when relay committed, before count's acknowledgement emptied its pending).
        rehanded = committed_counters(redis_client, app, "relay", CHAIN_SHARDS).get("replays", 0)
        assert rehanded >= 1, rehanded
        assert not marker.exists(), "a relay task died before the retry was armed"

        # 4. The task retry, armed now: its replays are told apart from the restart's.
        armed.touch()
        _send_chain(producer, chain_topic, rng, chain, RETRY_EVENTS)
        pipeline.wait_for(
            lambda: chain_collected() >= len(chain), 240, f"{len(chain)} events collected"
        )
        time.sleep(2.0)  # a (wrong) extra hand-over would land by now
        assert pipeline.alive(), pipeline.log_tail()  # no query failure: the task was retried
        phase("retried task's events collected")
    finally:
        pipeline.stop(30)
        phase("stopped")
    assert marker.exists(), "no relay task died after its commit"

    # Windows: every window at stage 2 once; windower's stranded checkpoints were dropped there.
    states = shard_states(redis_client, app, "collector", SHARDS)
    assert {k: s["windows"] for k, s in states.items()} == truth
    assert all(s["again"] == [] for s in states.values()), "a window reached stage 2 twice"
    collector = committed_counters(redis_client, app, "collector", SHARDS)
    windower = committed_counters(redis_client, app, "windower", SHARDS)
    assert collector.get("records") == expected
    # The stranded checkpoints came again and were dropped by id and position, not re-applied.
    assert collector.get("replays", 0) >= 1, collector
    assert windower.get("records") == len(windows)
    assert windower.get("timers_fired") == expected

    # Chain: every event at every stage once.
    keys = Counter(key for _, key in chain)
    assert shard_states(redis_client, app, "count", CHAIN_SHARDS) == dict(keys)
    # count's input ids are positions: the batch re-run after the crash was dropped by marks.
    counted = committed_counters(redis_client, app, "count", CHAIN_SHARDS)
    assert counted.get("records") == len(chain), counted
    assert counted.get("offset_marked", 0) > 0 and counted.get("replays", 0) >= 1, counted
    states = shard_states(redis_client, app, CHAIN_COLLECTOR, CHAIN_SHARDS)
    assert all(s["again"] == [] for s in states.values()), "an event reached collector twice"
    assert {k: sorted(s["events"]) for k, s in states.items()} == {
        k: sorted(e for e, key in chain if key == k) for k in keys
    }
    relay = committed_counters(redis_client, app, "relay", CHAIN_SHARDS)
    assert relay.get("records") == len(chain), relay
    assert relay.get("replays", 0) > rehanded, relay  # the retry found the dead attempt's records

    shards = {"windower": SHARDS, "collector": SHARDS}
    shards.update(dict.fromkeys(("count", "relay", CHAIN_COLLECTOR), CHAIN_SHARDS))
    for name in ("windower", "count", "relay"):
        left = _pending(redis_client, app, name, shards[name])
        assert left == 0, f"{name}: {left} checkpoints never acknowledged"
    for name, n in shards.items():
        counters = committed_counters(redis_client, app, name, n)
        faults = {c: counters.get(c, 0) for c in ("late", "dead_letters")}
        assert faults == {"late": 0, "dead_letters": 0}, (name, counters)
    # Nothing between two computations went through Kafka.
    listed = producer.list_topics(timeout=10).topics
    assert not {f"{app}.{s}" for s in ("windows", "counted", "relayed")} & set(listed), listed
