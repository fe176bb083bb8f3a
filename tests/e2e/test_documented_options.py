"""Options the README documents, proven on the runtime as a user runs them (issue #26 item 4).

`millstream infra up` starts detached Redis and Kafka; `millstream run --embedded` runs
`tests/e2e/options_target.py` on them (no REDIS_URL or KAFKA_BOOTSTRAP_SERVERS set), with a
`serde="bytes"`, a `serde="pickle"` and a `late="flag"` computation. Against what the test
sent: each state holds exactly the ids applied, in its serde's encoding read straight from
Redis; records sent behind the watermark reach the flagged computation marked late and are
counted late. Stopping the run leaves the detached services up; `millstream infra down` stops
them, and `infra status` then says so.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer

from millstream.state.keys import ShardKeys
from millstream.state.watermarks import WatermarkAuthority
from millstream.status import committed_counters
from millstream.testing.infra import create_topic
from millstream.testing.process import PipelineProcess
from tests.e2e.options_target import SHARDS
from tests.e2e.sink_faults import ROOT

pytestmark = pytest.mark.spark

ON_TIME, LATE, KEYS = 30, 10, 4


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "millstream.cli", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _states(client: Any, app: str, computation: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for shard in range(SHARDS):
        for key, raw in client.hgetall(ShardKeys(app, computation, shard).state).items():
            out[key.decode()] = raw
    return out


def _send(producer: Producer, topic: str, first: int, n: int, ts: int) -> dict[str, set[str]]:
    sent: dict[str, set[str]] = {}
    for i in range(first, first + n):
        key, event = f"k{i % KEYS}", f"e{i}"
        producer.produce(
            topic, value=json.dumps({"e": event, "k": key}), headers=[("id", event.encode())],
            timestamp=ts,
        )  # fmt: skip
        sent.setdefault(key, set()).add(event)
    assert producer.flush(10) == 0
    return sent


def test_bytes_and_pickle_serdes_and_late_flag_under_run_embedded_on_infra_up(
    tmp_path: Path,
) -> None:
    app = "options"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MILLSTREAM_", "KAFKA_BOOTSTRAP", "REDIS_URL"))
    }
    env.update(MILLSTREAM_STATE_DIR=str(tmp_path / "state"), MILLSTREAM_APP=app)
    up = _cli(env, "infra", "up")
    assert up.returncode == 0, up.stderr
    infra = json.loads(up.stdout)
    assert infra["up"], infra
    pids = [s["pid"] for s in infra["services"].values()]
    pipeline = None
    try:
        client = redis.Redis.from_url(infra["redis_url"])
        topic = create_topic(infra["kafka_bootstrap"], partitions=2)
        producer = Producer({"bootstrap.servers": infra["kafka_bootstrap"]})
        sent = _send(producer, topic, 0, ON_TIME, int(time.time() * 1000))
        pipeline = PipelineProcess(
            [sys.executable, "-m", "millstream.cli", "run", "--embedded",
             "tests.e2e.options_target:topology"],
            {**env, "OPTIONS_TARGET_TOPIC": topic, "MILLSTREAM_TRIGGER_MS": "300"},
            tmp_path / "pipeline.log", cwd=ROOT,
        )  # fmt: skip
        pipeline.start()

        def on_time() -> int:
            return sum(json.loads(s)["on_time"] for s in _states(client, app, "flagged").values())

        pipeline.wait_for(lambda: on_time() == ON_TIME, 120, f"{ON_TIME} records applied")
        # Late: stamped a minute behind a watermark that has passed the on-time records.
        authority = WatermarkAuthority(client, app)
        sent_at = int(time.time() * 1000)
        pipeline.wait_for(
            lambda: (wm := authority.published("flagged")) is not None and wm.event > sent_at,
            60,
            "the watermark past the on-time records",
        )
        late = _send(producer, topic, ON_TIME, LATE, sent_at - 60_000)

        def flagged() -> int:
            return sum(len(json.loads(s)["late"]) for s in _states(client, app, "flagged").values())

        pipeline.wait_for(lambda: flagged() == LATE, 60, f"{LATE} late records flagged")
        time.sleep(1.0)  # a (wrong) second application would land by now
        assert pipeline.stop(30) == 0, pipeline.log_tail()
        status = json.loads(_cli(env, "infra", "status").stdout)
        assert status["up"], "stopping the run stopped the services infra up started"

        # `raw` and `pickled` drop late records (the default), counting them.
        raw = _states(client, app, "raw")
        assert {k: set(v.rstrip(b";").decode().split(";")) for k, v in raw.items()} == sent
        assert all(v.count(b";") == len(sent[k]) for k, v in raw.items())  # once each
        pickled = _states(client, app, "pickled")
        assert {k: pickle.loads(v) for k, v in pickled.items()} == sent
        flagged_states = {k: json.loads(v) for k, v in _states(client, app, "flagged").items()}
        assert {k: set(s["late"]) for k, s in flagged_states.items() if s["late"]} == late
        counters = committed_counters(client, app, "flagged", SHARDS)
        assert counters.get("late") == LATE and counters.get("records") == ON_TIME + LATE
        for dropping in ("raw", "pickled"):
            assert committed_counters(client, app, dropping, SHARDS).get("late") == LATE
    finally:
        if pipeline is not None:
            pipeline.stop(30)
        down = _cli(env, "infra", "down")
    assert down.returncode == 0 and down.stdout.strip() == "stopped", down
    assert json.loads(_cli(env, "infra", "status").stdout)["up"] is False
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"service {pid} still runs"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
