"""A second copy of a running application is told so, waits, and takes over (#26 item 6).

Two `millstream run` processes of `tests/e2e/replay_target.py` with the same application and
checkpoints. The second logs who holds the application (host, process, since when, last
heartbeat) and waits: it starts no query, and the first sees no query failure. The first is
SIGKILLed; the second says it took over and applies what follows. Every event is applied once
(each computation's per-key id lists against what was sent), and a clean stop releases the
application.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state import holder
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import shard_states
from tests.e2e.replay_target import SHARDS
from tests.e2e.sink_faults import ROOT, pipeline_env

pytestmark = pytest.mark.spark

KEYS = 4


def _send(producer: Producer, topic: str, first: int, n: int, sent: dict[str, list[str]]) -> None:
    now = int(time.time() * 1000)
    for i in range(first, first + n):
        key, event = f"k{i % KEYS}", f"e{i}"
        producer.produce(
            topic, value=json.dumps({"e": event, "k": key, "v": 1}),
            headers=[("id", event.encode())], timestamp=now, partition=i % 2,
        )  # fmt: skip
        sent.setdefault(key, []).append(event)
    assert producer.flush(10) == 0


def _applied(client: Any, app: str) -> dict[str, list[str]]:
    return {k: sorted(v) for k, v in shard_states(client, app, "counter", SHARDS).items()}


def test_a_second_copy_waits_as_a_standby_and_takes_over_when_the_first_is_killed(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    (tmp_path / "fixed").touch()
    env = pipeline_env(
        redis_url, kafka_bootstrap, app, tmp_path, REPLAY_TARGET_TOPIC=topic,
        REPLAY_TARGET_FIX=str(tmp_path / "fixed"), MILLSTREAM_LOG_LEVEL="INFO",
    )  # fmt: skip
    first = PipelineProcess.run_target(
        "tests.e2e.replay_target:topology", env, tmp_path / "first.log", cwd=ROOT
    )
    second = PipelineProcess.run_target(
        "tests.e2e.replay_target:topology", env, tmp_path / "second.log", cwd=ROOT
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    sent: dict[str, list[str]] = {}
    truth = lambda: {k: sorted(v) for k, v in sent.items()}  # noqa: E731
    try:
        first.start()
        _send(producer, topic, 0, 100, sent)
        first.wait_for(lambda: _applied(redis_client, app) == truth(), 120, "the first copy")
        second.start()
        told = f"process {first.pid}, holding it since"
        second.wait_for(lambda: told in second.log_path.read_text(), 60, "the standby's notice")
        notice = next(x for x in second.log_path.read_text().splitlines() if told in x)
        assert "WARNING" in notice and "waits as a standby" in notice, notice

        _send(producer, topic, 100, 100, sent)  # the first copy goes on alone
        first.wait_for(lambda: _applied(redis_client, app) == truth(), 60, "the first copy")
        assert second.alive() and "started query" not in second.log_path.read_text()
        assert "failed (restart" not in first.log_path.read_text()  # no clash on checkpoints
        assert holder.current(redis_client, app).pid == first.pid  # type: ignore[union-attr]

        first.kill9()
        killed_at = time.monotonic()
        second.wait_for(lambda: "started query" in second.log_path.read_text(), 120, "the takeover")
        took = time.monotonic() - killed_at
        log = second.log_path.read_text()
        assert f"(process {first.pid} on this host) is gone" in log, log[-3000:]
        assert "this copy took over application" in log
        assert holder.current(redis_client, app).pid == second.pid  # type: ignore[union-attr]
        _send(producer, topic, 200, 100, sent)
        second.wait_for(lambda: _applied(redis_client, app) == truth(), 120, "the second copy")
        time.sleep(1.0)  # a (wrong) second application would land by now
        assert _applied(redis_client, app) == truth()  # each id once, across the takeover
        reader = {
            k: sorted(v) for k, v in shard_states(redis_client, app, "reader", SHARDS).items()
        }
        assert reader == truth()
        assert took < 60, took
        assert second.stop(30) == 0, second.log_tail()
        assert holder.current(redis_client, app) is None  # released on a clean stop
    finally:
        first.stop(10)
        second.stop(30)
