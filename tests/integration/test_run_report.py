"""`millstream run`'s reporter against real Redis and a real dead-letters topic (no Spark: the
counters and letters are written here as the runtime writes them after a batch).

One WARNING per (computation, reason), naming it and the topic; the rest counted, at most once
per interval; progress lines only when something moved; a one-line summary at the end; letters
from before the reporter started are not news.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.report import Reporter, reason_kind
from millstream.state.keys import app_key

CONTRACT = (
    "TimestampContractError: produce() to 'windows' stamped 1000, earlier than its cause "
    "(timer 'w' at 2000, at 2000) by 1000 ms"
)
OVERSIZED = "record of {n} bytes (key plus value) exceeds MILLSTREAM_MAX_RECORD_BYTES=1024"


def _wait(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_reason_kinds() -> None:
    assert reason_kind(CONTRACT) == "TimestampContractError"
    assert reason_kind("window: ValueError: bad") == "window: ValueError"
    assert reason_kind(OVERSIZED.format(n=2000)) == reason_kind(OVERSIZED.format(n=3000))


def test_reporter_warns_once_per_reason_then_counts(
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2, name=f"{app}.dead-letters")
    metrics = app_key(app, "metrics", "windower")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})

    def letters(n: int, error: str, **body: Any) -> None:
        """What a batch leaves: n letters in the topic, then the counter in the metrics hash."""
        for i in range(n):
            value = {"computation": "windower", "key": f"k{i}", "error": error, **body}
            producer.produce(topic, key=f"k{i}", value=json.dumps(value), partition=i % 2)
        assert producer.flush(10) == 0
        redis_client.hincrby(metrics, "dead_letters", n)

    letters(2, "ZeroDivisionError: from an earlier run", stream="events")
    redis_client.hset(metrics, mapping={"records": 10, "updated_at": 1})

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    def infos() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]

    caplog.set_level(logging.INFO, logger="millstream.report")
    reporter = Reporter(
        app,
        ["windower"],
        redis_client,
        {"bootstrap.servers": kafka_bootstrap},
        topic,
        report_seconds=1,
        count_every=2.0,
    )
    reporter.start()
    try:
        time.sleep(1.0)
        letters(3, CONTRACT, timer={"tag": "w", "time": 2000, "domain": "event", "hold": None})
        _wait(lambda: len(warnings()) == 1, "the first WARNING")
        first = warnings()[0]
        assert "computation windower" in first and "a timer (tag 'w', time 2000)" in first
        assert CONTRACT in first and f"Kafka topic {topic}" in first
        assert "ZeroDivisionError" not in " ".join(warnings())  # before this run: not news

        letters(2, OVERSIZED.format(n=5000), stream="events")
        _wait(lambda: len(warnings()) >= 2, "a WARNING for the second reason")
        assert "a record of stream 'events'" in warnings()[1]
        letters(4, OVERSIZED.format(n=7000), stream="events")  # the same reason: counted
        letters(1, CONTRACT, timer={"tag": "w", "time": 3000, "domain": "event", "hold": None})
        _wait(lambda: any("dead letter(s) in the last" in w for w in warnings()), "a count")
        counts = [w for w in warnings() if "dead letter(s) in the last" in w]
        assert "(10 in this run)" in counts[-1] and topic in counts[-1], counts
        reasons = [w for w in warnings() if "dead letter(s) in the last" not in w]
        assert len(reasons) == 2, reasons

        redis_client.hincrby(metrics, "records", 5)
        _wait(lambda: any("(15 in all)" in m for m in infos()), "a progress line")
        progress = [m for m in infos() if "windower:" in m]
        assert "dead letters 12" in progress[-1] and "records/s" in progress[-1], progress
        time.sleep(2.5)  # nothing moves: no more progress lines
        assert [m for m in infos() if "windower:" in m] == progress
    finally:
        summary = reporter.finish()
    assert summary.startswith(f"app {app} stopped after"), summary
    assert "windower 5 records" in summary and "10 dead letters" in summary, summary
