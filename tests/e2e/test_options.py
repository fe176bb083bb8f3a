"""Per-computation options on real Spark, Redis and Kafka: weak productions, and a computation
added to a running application without restarting the others."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, ConfigurationError, Context, Record, Topology, kafka_source
from millstream.state.keys import ShardKeys, app_key
from tests.e2e.conftest import wait_until


class Forward(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("forwarded", ctx.key, record.value)


class Tally(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def _send(bootstrap: str, topic: str, n: int, keys: int = 10, first: int = 0) -> Counter[str]:
    """Send n records with ids r<first>..; returns the count per key."""
    producer = Producer({"bootstrap.servers": bootstrap})
    truth: Counter[str] = Counter()
    for i in range(first, first + n):
        key = f"k{i % keys}"
        truth[key] += 1
        producer.produce(topic, key=key, value=f"v{i}".encode(), headers=[("id", f"r{i}".encode())])
    assert producer.flush(10) == 0
    return truth


def _metric(client: Any, app: str, comp: str, name: str) -> int:
    return int(client.hget(app_key(app, "metrics", comp), name) or 0)


def _states(client: Any, app: str, comp: str, shards: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for shard in range(shards):
        for key, value in client.hgetall(ShardKeys(app, comp, shard).state).items():
            out[key.decode()] = int(value)
    return out


def test_weak_productions_are_delivered_before_commit_and_counted_once_downstream(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    """Weak productions to a stream another query reads go to its topic before the commit;
    `tally`, added later in a query of its own, reads them from the earliest one."""
    topic = kafka_topic_factory(partitions=2)
    truth = _send(kafka_bootstrap, topic, 300)
    topology = Topology(redis_namespace)
    topology.source("input", kafka_source(topic, id_header="id"))
    topology.computation(
        "forward", Forward(), inputs=["input"], outputs=["forwarded"], productions="weak"
    )
    app = start_app(topology, shards=2)
    wait_until(
        lambda: _metric(redis_client, redis_namespace, "forward", "records") >= 300,
        120,
        "forward",
        app,
    )
    topology.computation("tally", Tally(), inputs=["forwarded"], start="earliest")
    app.start(["tally"])
    wait_until(
        lambda: _metric(redis_client, redis_namespace, "tally", "records") >= 300, 120, "tally", app
    )
    assert _metric(redis_client, redis_namespace, "forward", "weak_delivered") == 300
    assert (
        _metric(redis_client, redis_namespace, "forward", "productions") == 0
    )  # none checkpointed
    assert _states(redis_client, redis_namespace, "tally", 2) == dict(truth)
    assert sorted(app.runners) == ["main", "tally"]


def test_weak_productions_to_an_external_sink_are_rejected(redis_namespace: str) -> None:
    topology = Topology(redis_namespace)
    topology.source("input", kafka_source("t"))
    topology.computation(
        "forward", Forward(), inputs=["input"], outputs=["forwarded"], productions="weak"
    )
    topology.sink("forwarded", object())
    with pytest.raises(ConfigurationError, match="weak productions go only to internal streams"):
        topology.validate()


def test_a_computation_added_to_a_running_application_leaves_the_others_running(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    topic = kafka_topic_factory(partitions=2)
    truth = _send(kafka_bootstrap, topic, 200)
    topology = Topology(redis_namespace)
    topology.source("input", kafka_source(topic, id_header="id"), max_out_of_order_ms=10_000)
    topology.computation("first", Tally(), inputs=["input"])
    app = start_app(topology, shards=2)
    wait_until(
        lambda: _metric(redis_client, redis_namespace, "first", "records") >= 200, 120, "first", app
    )
    first_query = app.runners["main"].query

    topology.computation("second", Tally(), inputs=["input"], start="earliest")
    app.start(["second"])
    more = _send(kafka_bootstrap, topic, 100, first=200)
    wait_until(
        lambda: _metric(redis_client, redis_namespace, "second", "records") >= 300,
        120,
        "second",
        app,
    )
    wait_until(
        lambda: _metric(redis_client, redis_namespace, "first", "records") >= 300, 60, "first", app
    )
    assert app.runners["main"].query is first_query and first_query.isActive
    assert _states(redis_client, redis_namespace, "second", 2) == dict(truth + more)
    assert _states(redis_client, redis_namespace, "first", 2) == dict(truth + more)
