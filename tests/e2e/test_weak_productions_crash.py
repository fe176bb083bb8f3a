"""Weak productions under a crash: delivered downstream, then SIGKILL before the commit.

`tests/e2e/weak_target.py` (forward --weak--> topic --> tally) runs as `millstream run`: weak
productions are delivered to the stream's topic before the producer commits, and tally reads
that topic as an outside consumer would. A test-only fault point SIGKILLs every process of the pipeline right after a
shard delivered its weak productions and before that shard committed. Restarted, the batch is
replayed: `forward` runs the same records again and re-emits the same productions under the
same deterministic ids (derived from the record id and the index), so `tally` drops the second
copies as duplicates. Every event must be counted once downstream (ground truth from what was
sent), and the raw topic must show the re-sent copies, so the test proves the dedup did it.
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

from millstream.status import committed_counters
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import read_topic, shard_states
from tests.e2e.sink_faults import ROOT, pipeline_env
from tests.e2e.weak_target import SHARDS

pytestmark = pytest.mark.spark

CRASH_ON = 3
TOTAL = 160


def _send(producer: Producer, topic: str, rng: random.Random, first: int, n: int) -> list[tuple[str, str]]:  # fmt: skip
    events = [(f"e{i}", f"k{rng.randrange(6)}") for i in range(first, first + n)]
    for event, key in events:
        producer.produce(
            topic, key=key, value=json.dumps({"e": event, "k": key}),
            headers=[("id", event.encode())], partition=rng.randrange(2),
        )  # fmt: skip
    assert producer.flush(10) == 0
    return events


def test_sigkill_after_weak_delivery_before_commit_counts_each_event_once(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    rng = random.Random(1802)
    crash_file = tmp_path / "crash-points"
    base = pipeline_env(redis_url, kafka_bootstrap, app, tmp_path, WEAK_TARGET_TOPIC=topic)
    crashing = {
        **base,
        "MILLSTREAM_TEST_CRASH_AT": f"after_weak_delivery:{CRASH_ON}",
        "MILLSTREAM_TEST_CRASH_FILE": str(crash_file),
    }
    pipeline = PipelineProcess.run_target(
        "tests.e2e.weak_target:topology", crashing, tmp_path / "pipeline.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    events: list[tuple[str, str]] = []
    pipeline.start()
    try:
        # Small waves after the first batch, so later batches deliver weak productions too,
        # until the fault point kills the pipeline (at most TOTAL - 20 before the crash).
        events += _send(producer, topic, rng, 0, 10)
        deadline = time.monotonic() + 240
        while pipeline.alive():
            assert time.monotonic() < deadline, f"no crash:\n{pipeline.log_tail()}"
            started = committed_counters(redis_client, app, "forward", SHARDS).get("records")
            if started and len(events) < TOTAL - 20:
                events += _send(producer, topic, rng, len(events), 10)
            time.sleep(1.0)
        assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
        hits = crash_file.read_text().splitlines()
        assert hits[-1] == f"CRASH after_weak_delivery {CRASH_ON}", hits

        events += _send(producer, topic, rng, len(events), TOTAL - len(events))
        truth = Counter(key for _, key in events)

        def tallied() -> int:
            states = shard_states(redis_client, app, "tally", SHARDS)
            return sum(s["n"] for s in states.values())

        pipeline.start(base)  # no crash point this time
        pipeline.wait_for(lambda: tallied() >= TOTAL, 180, f"{TOTAL} events tallied")
        time.sleep(3.0)  # a (wrong) extra copy would be applied by now
    finally:
        pipeline.stop(30)

    states = shard_states(redis_client, app, "tally", SHARDS)
    assert {k: s["n"] for k, s in states.items()} == dict(truth)
    assert all(s["again"] == [] for s in states.values()), "an event was applied twice"
    assert sorted(e for s in states.values() for e in s["events"]) == sorted(e for e, _ in events)
    forward = committed_counters(redis_client, app, "forward", SHARDS)
    tally = committed_counters(redis_client, app, "tally", SHARDS)
    assert forward.get("records") == TOTAL and tally.get("records") == TOTAL
    # The crashed shard's weak productions were in the topic before the crash and were sent
    # again by the replay: the raw topic holds more than TOTAL records, the extra ones under
    # ids seen before, and tally dropped exactly those.
    raw = read_topic(kafka_bootstrap, f"{app}.forwarded", expected=TOTAL)
    ids = Counter(dict(m.headers())["ms-id"] for m in raw)
    resent = sum(n - 1 for n in ids.values())
    assert len(ids) == TOTAL and resent > 0, (len(ids), resent)
    assert tally.get("duplicates", 0) == resent, tally  # same id, another position
