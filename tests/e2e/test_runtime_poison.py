"""Poison and malformed records on real Spark, Redis and Kafka.

A record whose user code keeps raising is retried MILLSTREAM_USER_RETRIES times, then lands in
the `dead-letters` stream exactly once (even when the source sends it again) with the error,
the computation, the key and its position; every other record, including later ones of the same
key, is processed normally. A Kafka record without the configured id header becomes an
injector error row and reaches the dead letters with its position too.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.headers import HEADER_ID
from millstream.state.client import connect
from tests.e2e.conftest import metric, read_topic, shard_states, wait_until

pytestmark = pytest.mark.spark

SHARDS = 3
USER_RETRIES = 1


class Tally(Computation):
    """Sums amounts per key; raises on the poison record (counting its attempts in Redis)."""

    def __init__(self, redis_url: str, attempts_key: str) -> None:
        self.redis_url = redis_url
        self.attempts_key = attempts_key

    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        ctx.set_state(ctx.get_state(0) + body["amount"])  # discarded when this call raises
        if body.get("poison"):
            connect(self.redis_url).incr(self.attempts_key)
            raise ValueError(f"cannot handle order {body['order']}")


def test_poison_record_and_malformed_input_go_to_dead_letters(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
    redis_url: str,
) -> None:
    rng = random.Random(11)
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    attempts_key = f"{app_name}:poison-attempts"
    topology = Topology(app_name)
    # Generous disorder bound: on a loaded machine the broker may expose a record seconds after
    # its timestamp, and no record may be dropped as late here.
    topology.source("orders", kafka_source(topic, id_header="oid"), max_out_of_order_ms=30_000)
    topology.computation(
        "tally", Tally(redis_url, attempts_key), inputs={"orders": json_field("k")}, shards=SHARDS
    )
    app = start_app(topology, user_retries=USER_RETRIES)

    positions: dict[str, list[tuple[int, int]]] = {}  # order -> (partition, offset) of its sends

    def remember(order: str) -> Any:
        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            positions.setdefault(order, []).append((msg.partition(), msg.offset()))

        return on_delivery

    producer = Producer({"bootstrap.servers": kafka_bootstrap})

    def send(order: str, key: str, amount: int, *, poison: bool = False, header: bool = True):
        body = {"order": order, "k": key, "amount": amount, "poison": poison}
        producer.produce(
            topic,
            key=key,
            value=json.dumps(body),
            headers=[("oid", order.encode())] if header else [],
            partition=rng.randrange(2),
            on_delivery=remember(order),
        )

    truth: Counter[str] = Counter()
    good = 0
    for i in range(60):
        key = f"k{i % 6}"
        amount = rng.randrange(1, 100)
        send(f"o{i}", key, amount)
        truth[key] += amount
        good += 1
        if i == 20:
            send("poison-1", "k2", 1000, poison=True)
        if i == 30:
            send("no-header", "k3", 5000, header=False)  # malformed: no id header
        if i == 40:
            send("poison-1", "k2", 1000, poison=True)  # the source sends it again
    assert producer.flush(10) == 0
    assert len(positions) == good + 2 and len(positions["poison-1"]) == 2

    def done() -> bool:
        return (
            metric(redis_client, app_name, "tally", "records") >= good
            and metric(redis_client, app_name, "tally", "delivered") >= 2
        )

    wait_until(done, 90, "every record processed and the dead letters delivered", app)
    letters = read_topic(kafka_bootstrap, topology.topic_of("dead-letters"), expected=2)
    app.check()
    assert metric(redis_client, app_name, "tally", "late") == 0

    # Everything else was processed normally: the poison's partial effect was discarded, later
    # records of the same key were applied.
    assert shard_states(redis_client, app_name, "tally", SHARDS) == dict(truth)
    assert metric(redis_client, app_name, "tally", "records") == good
    assert metric(redis_client, app_name, "tally", "user_errors") == 1
    assert metric(redis_client, app_name, "tally", "dead_letters") == 2
    assert metric(redis_client, app_name, "tally", "duplicates") == 1  # the poison, sent twice
    # One call plus USER_RETRIES retries, and never again for the duplicate.
    assert int(redis_client.get(attempts_key) or 0) == USER_RETRIES + 1

    # Internal streams are delivered at least once and read by id (the consumer dedups), so
    # "exactly once" here is: two dead letters, each under one id with one content.
    by_id: dict[bytes, set[bytes]] = {}
    for message in letters:
        by_id.setdefault(dict(message.headers())[HEADER_ID], set()).add(message.value())
    assert all(len(values) == 1 for values in by_id.values()), by_id
    bodies = [json.loads(next(iter(values))) for values in by_id.values()]
    assert len(bodies) == 2, bodies
    by_key = {b["key"]: b for b in bodies}
    assert set(by_key) == {"k2", ""}

    poison = by_key["k2"]
    assert poison["computation"] == "tally"
    assert poison["error"] == "ValueError: cannot handle order poison-1"
    assert poison["stream"] == "orders"
    assert poison["source"] == topic
    # Either delivery of the poison (same id, two positions) may be the one that is processed;
    # the other is then a duplicate.
    assert (poison["partition"], poison["offset"]) in positions["poison-1"]
    assert bytes.fromhex(poison["record_id"]) == b"poison-1"
    assert json.loads(poison["value"])["order"] == "poison-1"

    malformed = by_key[""]
    assert malformed["computation"] == "tally"
    assert "'oid' header" in malformed["error"], malformed["error"]
    assert malformed["source"] == topic
    assert [(malformed["partition"], malformed["offset"])] == positions["no-header"]
    assert json.loads(malformed["value"])["order"] == "no-header"
