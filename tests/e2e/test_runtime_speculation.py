"""Real Spark speculative execution against millstream's lease, on a two-host Spark cluster.

Spark never speculates on a `local[N]` master (TaskSchedulerImpl starts its speculation thread
only when not local), and never launches a speculative copy on a host that already runs an
attempt of the task, so `local-cluster` (one host) never speculates either. This test starts a
small standalone cluster (`millstream.testing.spark_cluster`) whose two workers bind two loopback
addresses, i.e. two hosts, and runs a millstream application in a separate driver process (its own
SparkSession, `spark.speculation=true`). In the batch with the data, the first attempt of one
shard task stalls inside user code until Spark's speculative copy of that task, on the other
host, has acquired the shard and committed; then it wakes up and carries on, a real
zombie. State and output must equal ground truth exactly.

Run as `python -m tests.e2e.test_runtime_speculation ARGS_JSON` this module is that driver.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.testing.spark_cluster import SparkCluster, spark_env

SHARDS = 4
COMPUTATION = "counter"
REPO = Path(__file__).resolve().parents[2]


class StallFirstAttempt(Computation):
    """Counts events per key, emitting the running count.

    The first call of the batch, if made by a task's first attempt, stalls until a newer owner
    took the shard and committed its effects (the driver delivers and acknowledges them).
    Every call notes (partition, attempt, host, pid) in Redis, outside any transaction.
    """

    def __init__(self, redis_url: str, app: str) -> None:
        self.redis_url = redis_url
        self.app = app

    def process_record(self, ctx: Context, record: Record) -> None:
        from pyspark import TaskContext

        from millstream.state.client import connect
        from millstream.state.keys import ShardKeys

        client = connect(self.redis_url)
        task = TaskContext.get()
        assert task is not None
        partition, attempt = task.partitionId(), task.attemptNumber()
        host = os.environ.get("SPARK_LOCAL_IP", "?")
        client.sadd(f"{self.app}:calls", f"{partition}:{attempt}:{host}:{os.getpid()}")
        if attempt == 0 and client.set(f"{self.app}:stalled", partition, nx=True):
            keys = ShardKeys(self.app, COMPUTATION, partition)
            token = int(client.get(keys.sequencer))
            version = int(client.get(keys.version) or 0)
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                if (
                    int(client.get(keys.sequencer)) > token
                    and int(client.get(keys.version) or 0) >= version + 1
                ):
                    client.set(f"{self.app}:woke", f"{token}:{version}")
                    break
                time.sleep(0.02)
            else:
                client.set(f"{self.app}:woke", "timeout")
        count = ctx.get_state(0) + 1
        ctx.set_state(count)
        body = json.loads(record.value)
        ctx.produce("counts", ctx.key, {"k": ctx.key, "n": count, "e": body["e"]})


def committed_count(client: Any, app: str, name: str) -> int:
    """A counter summed over the shards' metrics, which commit with the shards' effects.

    The driver's per-batch metrics add up the ShardResult of the attempt Spark kept; when a
    zombie's re-run (all replays) finishes first, that is the zombie's, so they can undercount.
    """
    from millstream.state.keys import ShardKeys

    return sum(
        int(client.hget(ShardKeys(app, COMPUTATION, shard).counters, name) or 0)
        for shard in range(SHARDS)
    )


def build_topology(app: str, topic: str, redis_url: str) -> Topology:
    topology = Topology(app)
    topology.source("events", kafka_source(topic, id_header="eid"))
    topology.computation(
        COMPUTATION,
        StallFirstAttempt(redis_url, app),
        inputs={"events": json_field("k")},
        outputs=["counts"],
        shards=SHARDS,
    )
    return topology


# --------------------------------------------------------------------------- the driver process


def _driver(args: dict[str, Any]) -> None:
    """A millstream application on the standalone cluster, with speculation on."""
    import logging

    from pyspark.sql import SparkSession

    from millstream.connectors.app import Application
    from millstream.connectors.targets import Endpoints
    from millstream.injectors import register
    from millstream.settings import Settings
    from millstream.state.client import connect
    from millstream.testing.infra import stop_spark_session

    logging.basicConfig(level=logging.WARNING)
    spark = (
        SparkSession.builder.master(args["master"])
        .appName("millstream-speculation")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "768m")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.multiplier", "2")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.minTaskRuntime", "1s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    topology = build_topology(args["app"], args["topic"], args["redis_url"])
    settings = Settings(
        redis_url=args["redis_url"],
        kafka_bootstrap_servers=args["bootstrap"],
        app=args["app"],
        checkpoint_dir=args["checkpoints"],
        shards=SHARDS,
        trigger_ms=200,
        small_batch_rows=0,  # shard work in Spark tasks, never in the driver: speculation
    )
    ends = Endpoints(redis_url=args["redis_url"], kafka={"bootstrap.servers": args["bootstrap"]})
    app = Application(topology, settings, ends, spark)
    app.prepare()
    app.start()
    client = connect(args["redis_url"])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            app.check()
            records = committed_count(client, args["app"], "records")
            # Acknowledged by the driver once delivered, under the lease they committed with.
            delivered = committed_count(client, args["app"], "acknowledged")
            if records >= args["expected"] and delivered >= args["expected"]:
                time.sleep(2)  # a few more batches: nothing more may happen
                app.check()
                break
            time.sleep(0.3)
        else:
            raise SystemExit("timed out waiting for the application")
    finally:
        app.stop()
        stop_spark_session(spark)


# --------------------------------------------------------------------------- the test


@pytest.mark.spark
@pytest.mark.slow
def test_real_spark_speculation_zombie_is_fenced(
    spark_cluster: SparkCluster,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
    redis_url: str,
    tmp_path: Path,
) -> None:
    from confluent_kafka import Producer

    from millstream.headers import HEADER_ID
    from millstream.state.keys import ShardKeys
    from tests.e2e.conftest import read_topic, shard_states

    rng = random.Random(17)
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    events = [(f"e{i}", f"k{rng.randrange(12)}") for i in range(120)]
    sent = events + rng.sample(events, 6)  # 5% duplicates
    rng.shuffle(sent)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for event_id, key in sent:
        producer.produce(
            topic,
            key=key,
            value=json.dumps({"e": event_id, "k": key}),
            headers=[("eid", event_id.encode())],
            partition=rng.randrange(2),
        )
    assert producer.flush(10) == 0
    truth = Counter(key for _, key in events)

    args = {
        "master": spark_cluster.master,
        "app": app_name,
        "topic": topic,
        "redis_url": redis_url,
        "bootstrap": kafka_bootstrap,
        "checkpoints": str(tmp_path / "checkpoints"),
        "expected": len(events),
    }
    log = tmp_path / "driver.log"
    with log.open("wb") as handle:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.test_runtime_speculation", json.dumps(args)],
            cwd=REPO,
            env=spark_env(SPARK_LOCAL_IP="127.0.0.1"),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: its Spark JVM goes with it
        )
        try:
            driver.wait(240)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(10)
    assert driver.returncode == 0, log.read_text(errors="replace")[-4000:]

    # Spark really speculated: the stalled shard task had a second attempt, on the other host.
    stalled = int(redis_client.get(f"{app_name}:stalled"))
    calls = [c.decode().split(":") for c in redis_client.smembers(f"{app_name}:calls")]
    attempts = {(int(a), h) for p, a, h, _ in calls if int(p) == stalled}
    assert {a for a, _ in attempts} >= {0, 1}, calls
    assert len({h for _, h in attempts}) == 2, attempts
    # The stalled first attempt woke up only after the copy had taken the lease and committed,
    # and its own commit was then rejected: run_shard logs the fencing in the executor's stderr.
    assert redis_client.get(f"{app_name}:woke") not in (None, b"timeout")
    keys = ShardKeys(app_name, COMPUTATION, stalled)
    executor_logs = "\n".join(
        path.read_text(errors="replace") for path in (tmp_path / "work").rglob("stderr")
    )
    assert f"shard {keys.tag} fenced by a newer owner" in executor_logs, executor_logs[-3000:]

    # Exactly once, whatever the zombie did: state and output equal ground truth.
    assert shard_states(redis_client, app_name, COMPUTATION, SHARDS) == dict(truth)
    assert committed_count(redis_client, app_name, "records") == len(events)
    assert int(redis_client.get(keys.sequencer)) >= 2
    assert redis_client.hlen(keys.productions) == 0
    output = read_topic(kafka_bootstrap, f"{app_name}.counts", expected=len(events))
    by_id: dict[bytes, set[bytes]] = {}
    for message in output:
        by_id.setdefault(dict(message.headers())[HEADER_ID], set()).add(message.value())
    assert all(len(values) == 1 for values in by_id.values())
    bodies = [json.loads(next(iter(values))) for values in by_id.values()]
    assert sorted(b["e"] for b in bodies) == sorted(e for e, _ in events)
    per_key: dict[str, list[int]] = {}
    for body in bodies:
        per_key.setdefault(body["k"], []).append(body["n"])
    assert {k: sorted(v) for k, v in per_key.items()} == {
        k: list(range(1, n + 1)) for k, n in truth.items()
    }


if __name__ == "__main__":
    _driver(json.loads(sys.argv[1]))
