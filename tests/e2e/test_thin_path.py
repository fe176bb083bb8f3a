"""The thinnest real path: a Kafka record through one computation, one guarded Redis commit and
one production into Kafka; with duplicated input, applied exactly once."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from millstream import Computation, Context, Record, Topology, kafka_source
from millstream.state.keys import app_key
from tests.e2e.conftest import wait_until


class ClickCounter(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        count = ctx.get_state(0) + 1
        ctx.set_state(count)
        ctx.produce("counts", ctx.key, {"user": ctx.key, "count": count})


def _read_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Any]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    idle = 0
    while idle < 10 and len(out) < expected + 50:
        message = consumer.poll(0.5)
        if message is None:
            idle += 1 if len(out) >= expected else 0
            continue
        if message.error():
            continue
        out.append(message)
    consumer.close()
    return out


def test_kafka_to_kafka_exactly_once_with_duplicates(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    rng = random.Random(3)
    topic = kafka_topic_factory(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    sent: list[tuple[str, str]] = []
    for i in range(600):
        user = f"user-{rng.randrange(20)}"
        sent.append((user, f"click-{i}"))
    duplicates = rng.sample(sent, 30)  # 5% sent again
    for user, click in sent + duplicates:
        producer.produce(topic, key=user, value=b"{}", headers=[("click-id", click.encode())])
    assert producer.flush(10) == 0
    truth = Counter(user for user, _ in sent)

    topology = Topology(redis_namespace)
    # Generous disorder bound: on a busy machine records can become visible late.
    topology.source("clicks", kafka_source(topic, id_header="click-id"), max_out_of_order_ms=10_000)
    topology.computation("counter", ClickCounter(), inputs=["clicks"], outputs=["counts"])
    app = start_app(topology)
    metrics = app_key(redis_namespace, "metrics", "counter")

    def done() -> bool:
        return int(redis_client.hget(metrics, "records") or 0) >= len(sent)

    wait_until(done, 120, "all records counted", app)
    wait_until(
        lambda: int(redis_client.hget(metrics, "delivered") or 0) >= len(sent),
        60,
        "deliveries",
        app,
    )
    assert int(redis_client.hget(metrics, "records")) == len(sent)
    assert int(redis_client.hget(metrics, "duplicates")) == len(duplicates)

    output = _read_all(kafka_bootstrap, topology.topic_of("counts"), 4, len(sent))
    ids = [dict(m.headers())["ms-id"] for m in output]
    assert len(set(ids)) == len(sent), "every production delivered, none twice (by id)"
    final: dict[str, int] = {}
    for message in output:
        body = json.loads(message.value())
        final[body["user"]] = max(final.get(body["user"], 0), body["count"])
    assert final == dict(truth)
