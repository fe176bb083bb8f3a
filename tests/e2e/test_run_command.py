"""`millstream run`: a second copy waits as a standby; SIGKILL of the first's whole driver
mid-run, the standby takes over: nothing lost, nothing doubled; SIGTERM stops it cleanly.

The second copy (#26 item 6) is started while the first runs: it logs who holds the application
(host, process, since when, last heartbeat) and starts no query, so the first sees no query
failure on their shared checkpoint. When the first is SIGKILLed it says it took over, and every
record is counted once against what was sent. A clean stop releases the application."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from millstream.state import holder
from millstream.state.keys import ShardKeys


def _start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "millstream.cli", "run", "tests.e2e.run_target:topology"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(Path(__file__).parents[2]),
        )


def _states(client: Any, app: str) -> dict[str, int]:
    """Per-key counts as committed in Redis: the ground the test stands on."""
    states: dict[str, int] = {}
    for shard in range(2):
        for key, value in client.hgetall(ShardKeys(app, "tally", shard).state).items():
            states[key.decode()] = int(value)
    return states


def _records(client: Any, app: str) -> int:
    return sum(_states(client, app).values())


def _wait(
    condition: Any, timeout: float, what: str, proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        assert proc.poll() is None, f"millstream run exited early:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def test_a_standby_takes_over_a_sigkilled_run_exactly_once_and_sigterm_stops_it(
    redis_url: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
    tmp_path: Path,
) -> None:
    topic = kafka_topic_factory(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    truth: Counter[str] = Counter()

    def send(first: int, n: int) -> None:
        for i in range(first, first + n):
            key = f"k{i % 7}"
            truth[key] += 1
            producer.produce(topic, key=key, value=b"v", headers=[("id", f"r{i}".encode())])
        assert producer.flush(10) == 0

    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MILLSTREAM_APP": redis_namespace,
        "MILLSTREAM_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "MILLSTREAM_SHARDS": "2",
        "MILLSTREAM_STATE_DIR": str(tmp_path / "state"),
        "RUN_TARGET_TOPIC": topic,
    }
    log, standby_log = tmp_path / "run.log", tmp_path / "standby.log"
    send(0, 300)
    proc = _start(env, log)
    _wait(lambda: _records(redis_client, redis_namespace) >= 300, 180, "first records", proc, log)
    standby = _start(env, standby_log)
    told = f"process {proc.pid}, holding it since"
    _wait(lambda: told in standby_log.read_text(), 60, "the notice", standby, standby_log)
    notice = next(x for x in standby_log.read_text().splitlines() if told in x)
    assert "WARNING" in notice and "waits as a standby" in notice, notice
    send(300, 300)
    _wait(lambda: _records(redis_client, redis_namespace) > 300, 60, "more records", proc, log)
    assert "started query" not in standby_log.read_text()  # it waits, the first runs alone
    assert "failed (restart" not in log.read_text()  # no clash on their checkpoint
    assert holder.current(redis_client, redis_namespace).pid == proc.pid  # type: ignore[union-attr]
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers, mid-run
    proc.wait()

    send(600, 300)
    proc = standby
    _wait(
        lambda: _records(redis_client, redis_namespace) >= 900,
        180,
        "all records",
        proc,
        standby_log,
    )
    time.sleep(2)  # let any replayed batch finish: it must not add anything
    states: dict[str, int] = {}
    for shard in range(2):
        for key, value in redis_client.hgetall(
            ShardKeys(redis_namespace, "tally", shard).state
        ).items():
            states[key.decode()] = int(value)
    assert states == dict(truth)
    assert _records(redis_client, redis_namespace) == 900
    took_over = standby_log.read_text()
    assert "this copy took over application" in took_over, took_over[-3000:]
    assert holder.current(redis_client, redis_namespace).pid == proc.pid  # type: ignore[union-attr]

    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, standby_log.read_text()[-3000:]
    assert holder.current(redis_client, redis_namespace) is None  # released on a clean stop
