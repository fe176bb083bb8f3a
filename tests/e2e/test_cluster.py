"""The whole pipeline on a Spark cluster and Redis Cluster, through the loss of an executor, of
a whole worker and of the driver (issue #29, "cluster end to end").

`millstream run tests.e2e.cluster_target:topology` drives a Spark standalone master with two
1-core workers on two loopback hosts (`millstream.testing.spark_cluster`), with its state on a 3-primary
Redis Cluster (each primary with a replica), an 8-partition input topic and the transactional
sink. Every batch's shard work runs in executors (MILLSTREAM_SMALL_BATCH_ROWS=0). 5% of events
are sent twice. In one run:
1. one executor JVM is SIGKILLed (its worker starts another; Spark retries its tasks);
2. a whole worker (daemon, executor, Python workers) is SIGKILLed and never comes back;
3. the driver is SIGKILLed and restarted;
4. a Redis primary fails over: its writes paused until its replica has all of them, then it is
   SIGKILLed and the replica takes over (`CLUSTER FAILOVER TAKEOVER`). Replication is
   asynchronous, so a primary that dies with writes its replica has not received loses them:
   that case is not exactly-once (see the README) and is not what this step tests.
Then every window's count, in the collector's state and in the sink's topic as a
read_committed consumer sees it, must equal ground truth computed here from what was sent, each
window delivered once.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.state.keys import ShardKeys
from millstream.state.watermarks import WatermarkAuthority
from millstream.testing.infra import RedisClusterHandle
from millstream.testing.process import PipelineProcess
from millstream.testing.spark_cluster import HOSTS, SparkCluster, driver_conf
from tests.e2e.cluster_target import SHARDS
from tests.e2e.conftest import shard_states
from tests.e2e.sink_faults import ROOT, pipeline_env
from tests.e2e.window_traffic import KEYS, PARTITIONS, Event, check, drain, send

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]


def _cluster_nodes(node: str) -> list[list[str]]:
    import redis

    host, port = node.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=5)
    try:
        text = client.execute_command("CLUSTER", "NODES")
    finally:
        client.close()
    text = text.decode() if isinstance(text, bytes) else str(text)
    return [line.split() for line in text.splitlines() if line.strip()]


def fail_over(handle: RedisClusterHandle, keys: list[str]) -> str:
    """Kill the primary holding the first of `keys` it can, once its replica has every write,
    and promote the replica.

    Never the node REDIS_URL names: a process that starts while that node is down cannot
    discover the cluster (the README says so)."""
    import redis
    import redis.cluster

    seed = handle.url.split("//", 1)[1].split("/", 1)[0]
    finder = redis.cluster.RedisCluster.from_url(handle.url)
    try:
        primaries = [finder.get_node_from_key(key) for key in keys]
    finally:
        finder.close()
    victim = next(f"{n.host}:{n.port}" for n in primaries if f"{n.host}:{n.port}" != seed)
    lines = _cluster_nodes(seed)
    victim_id = next(f[0] for f in lines if f[1].split("@")[0] == victim)
    replica = next(f[1].split("@")[0] for f in lines if f[3] == victim_id)
    host, port = victim.rsplit(":", 1)
    primary = redis.Redis(host=host, port=int(port), socket_timeout=5)
    host, port = replica.rsplit(":", 1)
    follower = redis.Redis(host=host, port=int(port), socket_timeout=5)
    try:
        primary.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
        offset = int(primary.info("replication")["master_repl_offset"])
        deadline = time.monotonic() + 10
        while int(follower.info("replication").get("slave_repl_offset", -1)) < offset:
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.01)
        service = next(p for p in handle.processes if f"127.0.0.1:{p.port}" == victim)
        service.kill9()
        follower.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        deadline = time.monotonic() + 30
        while follower.info("replication")["role"] != "master" or "cluster_state:ok" not in str(
            follower.execute_command("CLUSTER", "INFO")
        ):
            assert time.monotonic() < deadline, "the replica was not promoted"
            time.sleep(0.1)
    finally:
        primary.close()
        follower.close()
    return f"{victim} -> {replica}"


def test_a_pipeline_on_a_spark_cluster_and_redis_cluster_survives_executor_worker_and_driver_loss(
    spark_cluster: SparkCluster,
    redis_with_replicas: RedisClusterHandle,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    from millstream.state.client import connect

    app = redis_namespace
    source = kafka_topic_factory(partitions=PARTITIONS)
    output = kafka_topic_factory(partitions=4)
    conf = driver_conf(tmp_path / "spark-conf")  # the driver binds loopback; small executors
    env = pipeline_env(
        redis_with_replicas.url,
        kafka_bootstrap,
        app,
        tmp_path,
        MILLSTREAM_SPARK_MASTER=spark_cluster.master,
        MILLSTREAM_SMALL_BATCH_ROWS="0",  # shard work in executors, never in the driver
        SPARK_CONF_DIR=str(conf),
        SPARK_LOCAL_IP="127.0.0.1",
        CLUSTER_TARGET_INPUT=source,
        CLUSTER_TARGET_OUTPUT=output,
    )
    pipeline = PipelineProcess.run_target(
        "tests.e2e.cluster_target:topology", env, tmp_path / "pipeline.log", cwd=ROOT
    )
    client = connect(redis_with_replicas.url)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    rng = random.Random(2902)
    events: list[Event] = []
    authority = WatermarkAuthority(client, app)

    def collected() -> int:
        states = shard_states(client, app, "collector", SHARDS)
        return sum(len(s["windows"]) for s in states.values())

    def traffic_until(condition: Any, timeout: float, what: str) -> None:
        """Keep sending while waiting: the watermark moves and windows close."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert pipeline.alive(), pipeline.log_tail()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            send(producer, source, rng, events, 40)
            time.sleep(0.5)

    def more_collected(what: str) -> None:
        before = collected()
        traffic_until(lambda: collected() > before + KEYS, 150, what)

    pipeline.start()
    try:
        more_collected("the first windows, with executors on both hosts")
        assert all(spark_cluster.executors(host) for host in HOSTS)
        # 1. One executor JVM: its worker launches another, Spark retries its tasks.
        killed = spark_cluster.kill_executor(HOSTS[0])
        more_collected("windows after an executor was killed")
        traffic_until(
            lambda: any(pid != killed for pid in spark_cluster.executors(HOSTS[0])),
            60,
            f"a new executor on {HOSTS[0]}",
        )
        # 2. A whole worker, for good: the other one carries the application.
        spark_cluster.kill_worker(HOSTS[1])
        more_collected("windows after a worker was lost")
        # 3. The driver, restarted from its checkpoint.
        pipeline.kill9()
        assert pipeline.wait_exit(10) == -9
        send(producer, source, rng, events, 40)
        pipeline.start()
        more_collected("windows after the driver was restarted")
        # 4. The primary holding the collector's first shard fails over to its replica.
        shard_keys = [
            ShardKeys(app, name, shard).state
            for name in ("collector", "tumbling")
            for shard in range(SHARDS)
        ]
        moved = fail_over(redis_with_replicas, shard_keys)
        more_collected(f"windows after the failover {moved}")
        truth = drain(pipeline, producer, source, rng, events, authority, collected)
    finally:
        pipeline.stop(30)
        producer.flush(10)

    print(
        f"{len(events)} events ({sum(len(w) for w in truth.values())} windows) through an "
        f"executor kill, a worker loss and a driver restart"
    )
    states = check(client, app, kafka_bootstrap, output, events, truth, SHARDS, pipeline=pipeline)
    # The collector's shard work ran in executors on both hosts, never in the driver.
    assert {h for s in states.values() for h in s["hosts"]} == set(HOSTS)
