"""`millstream run` says what it is doing: the contract-breaking two-stage pipeline of
`tests/e2e/holds_target.py` (HOLDS_TARGET_HOLD=0: a timer produces stamped before its cause,
without a hold) run as a user runs it, at the default log level.

- A WARNING names the timestamp contract, the computation, the stream and the dead-letters
  topic within one batch after the one that committed the first dead letter (batches counted
  in the metrics hash the runtime writes after each batch, sampled here against the log
  line's own time), and within 5 s.
- Progress lines show each computation's counters; py4j's per-call INFO lines are gone.
- SIGTERM ends it with exit code 0 and a one-line summary of the run.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state.keys import app_key
from millstream.status import committed_counters
from millstream.testing.process import PipelineProcess
from tests.e2e.holds_target import SHARDS
from tests.e2e.sink_faults import ROOT, pipeline_env

pytestmark = pytest.mark.spark

LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (.*)$")


def _send(producer: Producer, topic: str, rng: random.Random, first: int, n: int) -> None:
    now = int(time.time() * 1000)
    for i in range(first, first + n):
        key = f"k{rng.randrange(4)}"
        producer.produce(
            topic,
            key=key,
            value=json.dumps({"e": i, "k": key}),
            headers=[("id", f"e{i}".encode())],
            timestamp=now - rng.randrange(500),
            partition=rng.randrange(2),
        )
    assert producer.flush(10) == 0


def _lines(log: Path) -> list[tuple[float, str, str]]:
    """(epoch seconds, level, message) of every line millstream's log format wrote."""
    out = []
    for raw in log.read_text(errors="replace").splitlines():
        match = LINE.match(raw)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, match.group(2), match.group(3)))
    return out


def test_run_warns_of_the_first_dead_letter_within_a_batch_and_is_quiet_otherwise(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    env = pipeline_env(
        redis_url,
        kafka_bootstrap,
        app,
        tmp_path,
        HOLDS_TARGET_TOPIC=topic,
        HOLDS_TARGET_HOLD="0",
        MILLSTREAM_REPORT_SECONDS="2",
    )
    del env["MILLSTREAM_LOG_LEVEL"]  # the default, as a user runs it
    log = tmp_path / "pipeline.log"
    pipeline = PipelineProcess.run_target("tests.e2e.holds_target:topology", env, log, cwd=ROOT)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    rng = random.Random(2601)

    # (time, batches run, dead letters committed) every 50 ms, from Redis, while it runs.
    samples: list[tuple[float, int, int]] = []
    sampling = threading.Event()

    def sample() -> None:
        from millstream.state.client import connect

        client = connect(redis_url, cached=False)
        while not sampling.is_set():
            batches = int(client.hget(app_key(app, "metrics", "windower"), "batches") or 0)
            dead = committed_counters(client, app, "windower", SHARDS).get("dead_letters", 0)
            samples.append((time.time(), batches, dead))
            time.sleep(0.05)

    def warning() -> tuple[float, str] | None:
        for at, level, message in _lines(log):
            if level == "WARNING" and "dead-lettered" in message:
                return at, message
        return None

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    pipeline.start()
    sampler.start()
    try:
        _send(producer, topic, rng, 0, 40)
        pipeline.wait_for(lambda: bool(samples) and samples[-1][2] > 0, 180, "a dead letter")
        pipeline.wait_for(lambda: warning() is not None, 30, "the dead-letter WARNING")
        _send(producer, topic, rng, 40, 40)  # more of the same reason: no second WARNING
        pipeline.wait_for(
            lambda: any("windower:" in m and "records/s" in m for _, _, m in _lines(log)),
            30,
            "a progress line",
        )
        pipeline.wait_for(
            lambda: committed_counters(redis_client, app, "windower", SHARDS).get("records") == 80,
            60,
            "all 80 records at the windower",
        )
        time.sleep(2.5)  # one more progress interval
    finally:
        sampling.set()
        code = pipeline.stop(60)
        sampler.join(5)
    elapsed = time.monotonic() - started
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]

    found = warning()
    assert found is not None
    at, message = found
    assert "computation windower" in message, message
    assert "TimestampContractError" in message and "'windows'" in message, message
    assert f"Kafka topic {app}.dead-letters" in message, message
    # Within one batch: the batches the runtime had finished when the first dead letter was
    # committed, against those finished when the WARNING was written.
    first = next(s for s in samples if s[2] > 0)
    at_warning = [s for s in samples if s[0] <= at]
    assert at_warning, (first, at)
    batches_between = at_warning[-1][1] - first[1]
    print(
        f"first dead letter seen {first[0]:.3f}, WARNING {at:.3f} "
        f"({at - first[0]:.2f} s, {batches_between} batches later); test took {elapsed:.0f} s"
    )
    # A dead letter is committed inside its batch, before the runtime counts that batch as
    # finished: its own end is one of these; the WARNING must come before the next one ends.
    assert batches_between <= 2, (first, at_warning[-1], message)
    assert at - first[0] < 5.0, (first, at)

    warnings = [m for _, level, m in _lines(log) if level == "WARNING" and "dead-lettered" in m]
    assert len(warnings) == 1, warnings  # one reason, one WARNING
    assert "Received command" not in text and "py4j" not in text, "py4j chatter in the log"
    assert "Traceback" not in text, text[-3000:]
    # Start-up names every setting (secrets masked: tests/unit/test_settings.py).
    settings = [m for _, level, m in _lines(log) if level == "INFO" and m.startswith("settings: ")]
    assert len(settings) == 1, text[-3000:]
    assert f"app={app} " in settings[0] and " report_seconds=2 " in settings[0], settings
    summary = [m for _, _, m in _lines(log) if m.startswith(f"app {app} stopped after")]
    assert len(summary) == 1, text[-3000:]
    assert "windower 80 records" in summary[0] and "dead letters" in summary[0], summary
