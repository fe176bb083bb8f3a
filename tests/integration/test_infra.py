"""The fixtures give a working Redis, Kafka, Spark and Redis Cluster, whichever path ran."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from millstream.testing.infra import KafkaHandle, RedisClusterHandle, RedisHandle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from millstream.embedded import KafkaService, RedisService


def test_redis_set_get(
    redis_service: RedisHandle, redis_client: redis.Redis, redis_namespace: str
) -> None:
    assert redis_service.kind in ("env", "testcontainers", "local-process")
    key = f"{redis_namespace}:greeting"
    assert redis_client.set(key, b"hello")
    assert redis_client.get(key) == b"hello"


def test_redis_namespaces_are_unique(redis_namespace: str) -> None:
    assert redis_namespace.startswith("mstest-") and len(redis_namespace) > 12


def test_kafka_produce_consume_with_headers(
    kafka_service: KafkaHandle, kafka_topic_factory: Callable[..., str]
) -> None:
    assert kafka_service.kind in ("env", "testcontainers", "local-process")
    topic = kafka_topic_factory(partitions=2)
    headers = [("trace", b"\x00\x01binary"), ("trace", b"dup"), ("empty", None)]
    producer = Producer({"bootstrap.servers": kafka_service.bootstrap, "enable.idempotence": True})
    errors: list[KafkaError] = []
    producer.produce(
        topic,
        key=b"k",
        value=b"payload",
        partition=1,
        headers=headers,
        on_delivery=lambda err, _msg: errors.append(err) if err else None,
    )
    assert producer.flush(15) == 0
    assert errors == []

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 1, 0)])
        message = None
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.error() is None
        assert (message.topic(), message.partition(), message.offset()) == (topic, 1, 0)
        assert (message.key(), message.value()) == (b"k", b"payload")
        assert message.headers() == headers
    finally:
        consumer.close()


def test_topic_factory_gives_fresh_topics(kafka_topic_factory: Callable[..., str]) -> None:
    first, second = kafka_topic_factory(), kafka_topic_factory(partitions=3)
    assert first != second


@pytest.mark.spark
def test_spark_counts_a_dataframe(spark: SparkSession, tmp_checkpoint: str) -> None:
    frame = spark.createDataFrame([(i, i % 3) for i in range(10)], ["n", "bucket"])
    assert frame.count() == 10
    counts = {row["bucket"]: row["count"] for row in frame.groupBy("bucket").count().collect()}
    assert counts == {0: 4, 1: 3, 2: 3}


def test_redis_cluster_spreads_keys_over_masters(redis_cluster: RedisClusterHandle) -> None:
    assert len(redis_cluster.nodes) == 3
    client = redis.cluster.RedisCluster.from_url(redis_cluster.url)
    try:
        keys = [f"mstest-{uuid.uuid4().hex}-{i}" for i in range(30)]
        for key in keys:
            client.set(key, key)
        assert [client.get(key) for key in keys] == [key.encode() for key in keys]
        owners = {client.get_node_from_key(key).name for key in keys}
        assert len(owners) == 3  # 30 random keys land on every master
        assert len({client.keyslot(key) for key in keys}) > 1
    finally:
        client.close()


def test_durable_redis_survives_kill9(durable_redis: RedisService) -> None:
    client = redis.Redis.from_url(durable_redis.url)
    client.set("k", "v")
    client.close()
    durable_redis.kill9()
    durable_redis.restart()
    client = redis.Redis.from_url(durable_redis.url)
    try:
        assert client.get("k") == b"v"
    finally:
        client.close()


def test_durable_kafka_keeps_data_across_broker_restart(durable_kafka: KafkaService) -> None:
    from millstream.testing.infra import create_topic

    topic = create_topic(durable_kafka.bootstrap)
    producer = Producer({"bootstrap.servers": durable_kafka.bootstrap})
    producer.produce(topic, value=b"kept", headers=[("h", b"1")])
    assert producer.flush(15) == 0
    durable_kafka.kill9()
    durable_kafka.restart()
    consumer = Consumer(
        {"bootstrap.servers": durable_kafka.bootstrap, "group.id": "g", "fetch.wait.max.ms": 50}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = None
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.value() == b"kept"
        assert message.headers() == [("h", b"1")]
    finally:
        consumer.close()


@pytest.mark.spark
def test_spark_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    """The session's Python workers run through `connectors/python_workers.py`'s launcher:
    pyspark compiled from its install, not compiled again from Spark's zip in each process."""
    files = (
        spark.sparkContext.parallelize(range(2), 2)
        .map(lambda _: __import__("pyspark").__file__)
        .collect()
    )
    assert files and all("/packages/pyspark/" in f and ".zip" not in f for f in files), files


@pytest.mark.spark
def test_spark_workers_start_with_the_shard_task_imported_and_are_kept(
    spark: SparkSession,
) -> None:
    """Forked by `millstream/worker_daemon.py`, a worker has the shard task's modules before
    its first task; `WarmWorkers` runs its job at start, and a shard job after it runs in the
    same workers (Spark reuses them)."""
    from millstream.connectors.shard_jobs import WarmWorkers

    def preloaded(rows: Iterator[int]) -> Iterator[tuple[int, bool, int, int, list[str]]]:
        """What a worker held before this task imported anything (pickled by value), how
        many objects of its heap the daemon froze (Spark's per-task collection skips them),
        and the jars on its path (Spark's core jar taken off by the daemon)."""
        import gc
        import os
        import sys

        found = "millstream.connectors.shard_task" in sys.modules
        jars = [p for p in sys.path if p.endswith(".jar")]
        jars.append("PYTHONPATH=" + os.environ.get("PYTHONPATH", ""))
        for _ in rows:
            yield os.getpid(), found, os.getppid(), gc.get_freeze_count(), jars

    daemon = spark.sparkContext.getConf().get("spark.python.daemon.module")
    assert daemon == "millstream.worker_daemon"
    warm = WarmWorkers()
    warm.start(spark)
    try:
        deadline = time.monotonic() + 60
        while not warm.pids and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        warm.stop()
    assert warm.pids, "the warming job did not run"
    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(preloaded).collect()
    assert all(found for _, found, _, _, _ in seen), seen
    assert all(frozen > 20_000 for *_, frozen, _ in seen), seen
    # Spark put its core jar on the workers' PYTHONPATH; the daemon took it off sys.path.
    assert all("spark-core" in jars[-1] for *_, jars in seen), seen
    assert not any("spark-core" in jar for *_, jars in seen for jar in jars[:-1]), seen
    assert {pid for pid, *_ in seen} <= set(warm.pids), (seen, warm.pids)
    parents = {parent for _, _, parent, _, _ in seen}
    commands = {Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p in parents}
    assert all(b"millstream.worker_daemon" in c for c in commands), commands
