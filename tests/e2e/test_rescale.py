"""`millstream rescale` on a running pipeline (issue #29, item 2), exactly-once.

The cluster test's application (`tests.e2e.cluster_target`: a lifted tumbling window whose
timers close each window, an internal stream, a hand-written collector, the transactional sink)
runs on local Spark and one Redis, 8 shards per computation, with 5% of events sent twice. In
one run, with traffic all along:
1. `millstream rescale APP tumbling --shards 16` while it runs; the driver is SIGKILLed (the
   whole pipeline) in the middle of the move, after 5 of the 16 new shards were written. The
   command keeps waiting; the restarted pipeline redoes the move before its first batch, and
   the command then reports it;
2. `tumbling` 16 -> 4 and `collector` 8 -> 4 (merges) while it runs;
3. `collector` (a hand-written computation, holding state per key) rescaled by a request made
   while the pipeline is stopped: applied at its next start.
After each move, 20 events applied before it are sent again: only the moved catalogs can tell
them from new ones.
Then every window's count, in the collector's state and in the sink's topic as a read_committed
consumer sees it, equals ground truth computed here from what was sent, each delivered once;
no window state is left open; the old layouts' keys are gone.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state.shard_count import ShardLayout, read_layout
from millstream.state.watermarks import WatermarkAuthority
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import shard_states
from tests.e2e.sink_faults import ROOT, pipeline_env
from tests.e2e.window_traffic import KEYS, PARTITIONS, Event, check, drain, send

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CRASH_AT = "rescale_after_shard_written:5"


def _rescale(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "millstream.cli", "rescale", env["MILLSTREAM_APP"], *args],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _finished(command: subprocess.Popen[str], timeout: float) -> str:
    out, _ = command.communicate(timeout=timeout)
    assert command.returncode == 0, out
    print(out)  # what moved and how long the move took, in the test's output
    return out


def test_a_running_pipeline_is_rescaled_8_16_4_through_a_crash_mid_move(
    redis_url: str,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    from millstream.state.client import connect

    app = redis_namespace
    source = kafka_topic_factory(partitions=PARTITIONS)
    output = kafka_topic_factory(partitions=4)
    crash_file = tmp_path / "crash-points"
    env = pipeline_env(
        redis_url, kafka_bootstrap, app, tmp_path,
        CLUSTER_TARGET_INPUT=source, CLUSTER_TARGET_OUTPUT=output, CLUSTER_TARGET_SHARDS="8",
    )  # fmt: skip
    crashing = {
        **env,
        "MILLSTREAM_TEST_CRASH_AT": CRASH_AT,
        "MILLSTREAM_TEST_CRASH_FILE": str(crash_file),
    }
    pipeline = PipelineProcess.run_target(
        "tests.e2e.cluster_target:topology", crashing, tmp_path / "pipeline.log", cwd=ROOT
    )
    client = connect(redis_url)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    rng = random.Random(2903)
    events: list[Event] = []
    authority = WatermarkAuthority(client, app)

    def collected() -> int:
        return sum(len(s["windows"]) for s in shard_states(client, app, "collector", 8).values())

    def traffic_until(condition: Any, timeout: float, what: str, dies: bool = False) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert dies or pipeline.alive(), pipeline.log_tail()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            send(producer, source, rng, events, 40)
            time.sleep(0.5)

    def more_collected(what: str) -> None:
        before = collected()
        traffic_until(lambda: collected() > before + KEYS, 150, what)

    resent: list[Event] = []

    def resend_old(n: int) -> None:
        """Events applied before the last move, sent again: only the moved catalogs know them
        (their windows are closed, so a record taken for new would be counted late)."""
        for event_id, key, ts in rng.sample(events, n):
            producer.produce(
                source, key=key, value=json.dumps({"e": event_id, "k": key}),
                headers=[("id", event_id.encode())], timestamp=ts,
                partition=rng.randrange(PARTITIONS),
            )  # fmt: skip
            resent.append((event_id, key, ts))
        assert producer.flush(10) == 0

    def layout(name: str) -> ShardLayout | None:
        return read_layout(client, app, name)

    pipeline.start()
    try:
        more_collected("the first windows")
        # 1. 8 -> 16 while running; the whole pipeline is SIGKILLed in the middle of the move.
        split = _rescale(env, "tumbling", "--shards", "16", "--timeout", "150")
        traffic_until(lambda: not pipeline.alive(), 60, "the crash in the middle of the move", True)
        assert f"CRASH {CRASH_AT.replace(':', ' ')}" in crash_file.read_text()
        assert layout("tumbling") == ShardLayout(8, 0)  # not switched: the old layout stands
        pipeline.start(env)
        out = _finished(split, 150)
        assert "rescaled tumbling" in out and "16 shards (layout generation 1)" in out, out
        resend_old(20)
        more_collected("windows after the split")
        # 2. Merges of both computations while running.
        merges = [
            _rescale(env, "tumbling", "--shards", "4"),
            _rescale(env, "collector", "--shards", "4"),
        ]
        traffic_until(lambda: all(c.poll() is not None for c in merges), 150, "both merges applied")
        for command in merges:
            _finished(command, 10)
        assert layout("tumbling") == ShardLayout(4, 2)
        assert layout("collector") == ShardLayout(4, 1)
        resend_old(20)
        more_collected("windows after the merges")
        # 3. A request made while the pipeline is stopped: its next start applies it.
        pipeline.stop(30)
        send(producer, source, rng, events, 40)
        stopped = _rescale(env, "collector", "--shards", "6")
        assert "its next `millstream run` moves the keys" in _finished(stopped, 30)
        pipeline.start(env)
        resend_old(20)
        more_collected("windows after the restart that applied the rescale")
        assert layout("collector") == ShardLayout(6, 2)
        truth = drain(pipeline, producer, source, rng, events, authority, collected)
    finally:
        pipeline.stop(30)
        producer.flush(10)

    # Counters moved with the keys; the 5% sent twice, and every event sent again after a
    # move, were recognised.
    check(client, app, kafka_bootstrap, output, events, truth, 8, len(resent) + 1, pipeline)
    # Only the current layouts' keys are left (and the old shards' tombstone sequencers).
    left = {k.decode() for k in client.scan_iter(match=f"ms:{{{app}:*", count=1000)}
    current = {f"ms:{{{app}:tumbling:{s}@2}}" for s in range(4)}
    current |= {f"ms:{{{app}:collector:{s}@2}}" for s in range(6)}
    stray = {k for k in left if k.split("}")[0] + "}" not in current and not k.endswith(":seq")}
    assert stray == set()
