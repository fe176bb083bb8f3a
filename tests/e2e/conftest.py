"""Helpers for end-to-end tests: a running millstream application on the shared fixtures."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.connectors.app import Application
from millstream.connectors.targets import Endpoints
from millstream.connectors.topology import Topology
from millstream.settings import Settings
from millstream.testing.infra import RedisClusterHandle, start_redis_cluster
from millstream.testing.spark_cluster import SparkCluster, standalone_cluster
from tests.e2e.sink_faults import ROOT, RecordedKafka, start_recorded_kafka


@pytest.fixture
def recorded_kafka(tmp_path: Path) -> Iterator[RecordedKafka]:
    """`durable_kafka` behind a proxy that records the broker's transactional answers."""
    with start_recorded_kafka(tmp_path / "durable-kafka") as kafka:
        yield kafka


@pytest.fixture
def redis_with_replicas(tmp_path: Path) -> Iterator[RedisClusterHandle]:
    """A private 3-primary Redis Cluster, a replica each (local processes: one is killed)."""
    handle = start_redis_cluster(tmp_path / "redis-cluster", environ={}, replicas=1)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    """A Spark standalone master and two 1-core workers on two loopback hosts."""
    with standalone_cluster(tmp_path, pythonpath=(str(ROOT),)) as cluster:
        yield cluster


@pytest.fixture
def start_app(
    spark: Any, redis_url: str, kafka_bootstrap: str, tmp_path: Any
) -> Iterator[Callable[..., Application]]:
    """`start_app(topology, **settings)`: prepare and start every computation; stopped after."""
    from millstream.injectors import register

    register(spark)
    apps: list[Application] = []

    def start(topology: Topology, **overrides: Any) -> Application:
        settings = Settings(
            redis_url=redis_url,
            kafka_bootstrap_servers=kafka_bootstrap,
            app=topology.app,
            checkpoint_dir=str(tmp_path / "checkpoints"),
            **{"shards": 4, "trigger_ms": 200, "query_restarts": 0, **overrides},
        )
        ends = Endpoints(redis_url=redis_url, kafka={"bootstrap.servers": kafka_bootstrap})
        app = Application(topology, settings, ends, spark)
        app.prepare()
        app.start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.stop()


def wait_until(condition: Callable[[], bool], timeout: float, what: str, app: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app is not None:
            app.check()
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


# --- helpers for the runtime end-to-end tests (tests/e2e/test_runtime_*.py) -------------------


def shard_states(client: Any, app: str, computation: str, shards: int) -> dict[str, Any]:
    """Every key's committed state of a computation (JSON serde), read straight from Redis:
    from the recorded layout's shards (a rescale changes them), else `shards` shards."""
    import json

    from millstream.state.shard_count import ShardLayout, read_layout

    layout = read_layout(client, app, computation) or ShardLayout(shards)
    out: dict[str, Any] = {}
    for keys in layout.keys(app, computation):
        for key, raw in client.hgetall(keys.state).items():
            out[key.decode()] = json.loads(raw)
    return out


def metric(client: Any, app: str, computation: str, name: str) -> int:
    """A computation's metric counter (summed by the driver after each batch); 0 when unset."""
    from millstream.state.keys import app_key

    return int(client.hget(app_key(app, "metrics", computation), name) or 0)


def read_topic(
    bootstrap: str, topic: str, *, expected: int = 0, quiet_polls: int = 6, timeout: float = 30.0
) -> list[Any]:
    """Every record of every partition of `topic` (plain consumer, from the beginning).

    Returns once at least `expected` records arrived and then `quiet_polls` polls of 0.25 s
    brought nothing new (so extra, duplicated records would be seen too).
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"e2e-reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        out: list[Any] = []
        idle = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (len(out) >= expected and idle >= quiet_polls):
            message = consumer.poll(0.25)
            if message is None:
                idle += 1
                continue
            if message.error():
                continue
            idle = 0
            out.append(message)
        return out
    finally:
        consumer.close()
