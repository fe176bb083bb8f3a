"""Dead letters a person can act on (issue #26 item 2), as a user runs them, with SIGKILLs.

`tests/e2e/replay_target.py` runs under `millstream run`: its `reader` dead-letters the 1,100
version-2 events it cannot read, its `counter` applies all 1,200. Then:

1. `millstream dead-letters APP` lists them with the reason, computation, key and position;
2. the fix is deployed and `dead-letters --replay --restamp` is SIGKILLed after its first chunk
   of 500 letters (a crash point in the command);
3. the pipeline applies that chunk and is SIGKILLed after the batch settled and before the
   queue entries were removed (a crash point in the runtime), then restarted;
4. the replay is run again (the 600 it had not queued) and a third time (nothing left).

Against what was sent: `reader` applied every event exactly once (the 500 it read again after
the crash were dropped as replays), `counter` applied none of the replays, no new dead letter
was written and the queue is empty.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state import replay
from millstream.status import committed_counters, status
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import shard_states
from tests.e2e.replay_target import SHARDS
from tests.e2e.sink_faults import ROOT, pipeline_env

pytestmark = pytest.mark.spark

GOOD, BAD, KEYS = 100, 1_100, 5


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "millstream.cli", "dead-letters", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _ids(client: Any, app: str, computation: str) -> dict[str, list[str]]:
    return {k: sorted(v) for k, v in shard_states(client, app, computation, SHARDS).items()}


def test_dead_letters_listed_then_replayed_exactly_once_through_sigkills(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    fix = tmp_path / "fixed"
    crashes = tmp_path / "crashes"
    env = pipeline_env(
        redis_url, kafka_bootstrap, app, tmp_path,
        REPLAY_TARGET_TOPIC=topic, REPLAY_TARGET_FIX=str(fix),
        MILLSTREAM_USER_RETRIES="0", MILLSTREAM_TEST_CRASH_FILE=str(crashes),
    )  # fmt: skip
    pipeline = PipelineProcess.run_target(
        "tests.e2e.replay_target:topology",
        {**env, "MILLSTREAM_TEST_CRASH_AT": "before_replays_removed"},
        tmp_path / "pipeline.log",
        cwd=ROOT,
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    sent: dict[str, list[str]] = {}
    now = int(time.time() * 1000)
    for i in range(GOOD + BAD):
        key, event = f"k{i % KEYS}", f"e{i}"
        version = 1 if i < GOOD else 2
        producer.produce(
            topic, value=json.dumps({"e": event, "k": key, "v": version}),
            headers=[("id", event.encode())], timestamp=now, partition=i % 2,
        )  # fmt: skip
        sent.setdefault(key, []).append(event)
    assert producer.flush(10) == 0
    expected = {k: sorted(v) for k, v in sent.items()}
    try:
        pipeline.start()

        def letters_committed() -> int:
            return committed_counters(redis_client, app, "reader", SHARDS).get("dead_letters", 0)

        pipeline.wait_for(lambda: letters_committed() == BAD, 180, f"{BAD} dead letters")
        pipeline.wait_for(
            lambda: _ids(redis_client, app, "counter") == expected, 60, "counter applied all"
        )

        # 1. The listing: counts per reason, then each letter with what a person needs.
        # Letters are committed in Redis, then delivered to their topic: list until all are.
        letters: list[dict[str, Any]] = []

        def listed() -> bool:
            out = _cli(env, app, "--json", "--computation", "reader")
            assert out.returncode == 0, out.stderr
            letters[:] = json.loads(out.stdout)
            return len(letters) >= BAD

        pipeline.wait_for(listed, 60, "every letter in the topic")
        assert len(letters) == BAD  # once each, though the topic is written at least once
        assert {x["reason"] for x in letters} == {"ValueError: unsupported event version 2"}
        assert all(x["replayable"] and x["stream"] == "events" for x in letters)
        assert sorted(json.loads(x["value"])["e"] for x in letters) == sorted(
            f"e{i}" for i in range(GOOD, GOOD + BAD)
        )
        assert all(x["key"] == json.loads(x["value"])["k"] for x in letters)
        text = _cli(env, app, "--limit", "2")
        assert f"{BAD} dead letters" in text.stdout, text
        assert f"{BAD:>7}  reader: ValueError: unsupported event version 2" in text.stdout, text

        # 2. The fix is out; the replay is SIGKILLed after its first chunk.
        fix.touch()
        killed = PipelineProcess(
            [sys.executable, "-m", "millstream.cli", "dead-letters", app, "--replay",
             "--restamp", "--yes"],
            {**env, "MILLSTREAM_TEST_CRASH_AT": "replay_chunk_queued",
             "MILLSTREAM_TEST_CRASH_FILE": str(tmp_path / "crashes-cli")},
            tmp_path / "replay-killed.log", cwd=ROOT,
        )  # fmt: skip
        killed.start()
        assert killed.wait_exit(60) == -9, killed.log_tail()
        assert "CRASH replay_chunk_queued 1" in (tmp_path / "crashes-cli").read_text()

        # 3. The pipeline applies that chunk and is SIGKILLed before the entries are removed.
        assert pipeline.wait_exit(120) == -9, pipeline.log_tail()
        assert "CRASH before_replays_removed 1" in crashes.read_text()
        assert replay.queued(redis_client, app) > 0  # applied, still queued
        assert status(redis_client, app)["replays_queued"] == replay.queued(redis_client, app)
        pipeline.start(env)

        # 4. The replay again: the 600 it had not queued; then nothing.
        again = _cli(env, app, "--replay", "--restamp", "--yes", "--json")
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)
        assert (report["queued"], report["already_replayed"]) == (BAD - replay.CHUNK, replay.CHUNK)
        pipeline.wait_for(
            lambda: _ids(redis_client, app, "reader") == expected, 120, "reader applied all"
        )
        third = json.loads(_cli(env, app, "--replay", "--restamp", "--yes", "--json").stdout)
        assert (third["queued"], third["already_replayed"]) == (0, BAD)
        pipeline.wait_for(lambda: replay.queued(redis_client, app) == 0, 60, "an empty queue")
        time.sleep(2.0)  # a (wrong) second application would land by now
        assert _ids(redis_client, app, "reader") == expected  # each id once
        assert _ids(redis_client, app, "counter") == expected  # replays never reached it
        reader = committed_counters(redis_client, app, "reader", SHARDS)
        assert reader.get("dead_letters") == BAD  # no letter twice, none new
        assert reader.get("replays", 0) > 0  # the re-read after the crash was dropped as such
        assert reader.get("late", 0) == 0  # restamped: on time
    finally:
        pipeline.stop(30)
