"""Three stages on real Spark, Redis and Kafka, fed duplicated, out-of-order input.

injector -> per-key counter -> re-keyed group aggregator -> (reporter computation and a
transactional Kafka sink). Every stage's committed state and the sink topic, as a
read_committed consumer sees it, must equal ground truth computed here, exactly.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.headers import HEADER_ID
from millstream.sinks.kafka_transactional import KafkaTransactionalSink
from millstream.testing.committed_reader import read_committed
from tests.e2e.conftest import metric, shard_states, wait_until

pytestmark = pytest.mark.spark

KEYS = 24
GROUPS = 5
EVENTS = 360
WAVES = 3
JITTER_MS = 3000  # event times lag their send time by up to this much, in random order


def group_of(key: str) -> str:
    return f"g{int(key.removeprefix('k')) % GROUPS}"


class KeyCounter(Computation):
    """Stage 1: counts each key's events and emits one increment per event, keyed by group."""

    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        ctx.set_state(ctx.get_state(0) + 1)
        ctx.produce("increments", body["g"], {"k": ctx.key, "g": body["g"], "e": body["e"]})


class GroupAggregator(Computation):
    """Stage 2: re-keyed by group; a running total per group, every new total emitted."""

    def process_record(self, ctx: Context, record: Record) -> None:
        total = ctx.get_state(0) + 1
        ctx.set_state(total)
        ctx.produce("totals", ctx.key, {"g": ctx.key, "total": total})


class Reporter(Computation):
    """Stage 3: per group, how many totals arrived and the highest one."""

    def process_record(self, ctx: Context, record: Record) -> None:
        total = json.loads(record.value)["total"]
        state = ctx.get_state({"n": 0, "max": 0})
        ctx.set_state({"n": state["n"] + 1, "max": max(state["max"], total)})


def test_three_stages_duplicates_out_of_order_exactly_once(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    rng = random.Random(20240611)
    app_name = redis_namespace
    source_topic = kafka_topic_factory(partitions=3)
    sink_topic = kafka_topic_factory(partitions=2)

    topology = Topology(app_name)
    topology.source(
        "events",
        kafka_source(source_topic, id_header="event-id"),
        max_out_of_order_ms=JITTER_MS + 4000,  # no record is late, even on a busy broker
    )
    topology.computation(
        "counter",
        KeyCounter(),
        inputs={"events": json_field("k")},
        outputs=["increments"],
        shards=4,
    )
    topology.computation(
        "aggregator",
        GroupAggregator(),
        inputs={"increments": json_field("g")},  # re-keyed: by group, not by key
        outputs=["totals"],
        shards=2,
    )
    topology.computation(
        "reporter", Reporter(), inputs={"totals": json_field("g")}, outputs=[], shards=2
    )
    topology.sink(
        "totals", KafkaTransactionalSink({"bootstrap.servers": kafka_bootstrap}, sink_topic)
    )
    app = start_app(topology)

    # Ground truth, computed independently of millstream.
    events = [(f"e{i}", f"k{rng.randrange(KEYS)}") for i in range(EVENTS)]
    duplicates = rng.sample(events, EVENTS // 20)  # 5% sent twice
    truth_keys = Counter(key for _, key in events)
    truth_groups = Counter(group_of(key) for _, key in events)

    # Random arrival order: shuffled, random partitions, event times jittered backwards;
    # a duplicate may come in a later wave and through another partition.
    waves: list[list[tuple[str, str]]] = [events[w::WAVES] for w in range(WAVES)]
    for event in duplicates:
        waves[rng.randrange(WAVES)].append(event)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for wave in waves:
        rng.shuffle(wave)
        now = int(time.time() * 1000)
        for event_id, key in wave:
            producer.produce(
                source_topic,
                key=key,
                value=json.dumps({"e": event_id, "k": key, "g": group_of(key)}),
                headers=[("event-id", event_id.encode())],
                timestamp=now - rng.randrange(JITTER_MS),
                partition=rng.randrange(3),
            )
        assert producer.flush(10) == 0
        time.sleep(1.0)

    def reported() -> int:
        return sum(s["n"] for s in shard_states(redis_client, app_name, "reporter", 2).values())

    wait_until(lambda: reported() >= EVENTS, 90, "the reporter saw every total", app)
    committed: list[Any] = []

    def sink_complete() -> bool:
        committed[:] = read_committed(kafka_bootstrap, sink_topic)
        return len(committed) >= EVENTS

    wait_until(sink_complete, 30, "the transactional sink committed every total", app)
    time.sleep(2.0)  # let any (wrong) extra effect land before the exact comparisons
    app.check()

    # Stage 1: one count per distinct event, whatever the duplicates and the arrival order.
    assert shard_states(redis_client, app_name, "counter", 4) == dict(truth_keys)
    assert metric(redis_client, app_name, "counter", "records") == EVENTS
    assert metric(redis_client, app_name, "counter", "duplicates") == len(duplicates)
    # Stage 2: re-keyed by group.
    assert shard_states(redis_client, app_name, "aggregator", 2) == dict(truth_groups)
    assert metric(redis_client, app_name, "aggregator", "records") == EVENTS
    # Stage 3: every total arrived exactly once.
    assert shard_states(redis_client, app_name, "reporter", 2) == {
        group: {"n": n, "max": n} for group, n in truth_groups.items()
    }
    for name in ("counter", "aggregator", "reporter"):
        assert metric(redis_client, app_name, name, "late") == 0, name
        assert metric(redis_client, app_name, name, "dead_letters") == 0, name

    # The sink: a read_committed consumer sees each total exactly once: 1..n per group.
    committed = read_committed(kafka_bootstrap, sink_topic)
    ids = [record.header(HEADER_ID) for record in committed]
    assert None not in ids
    assert len(ids) == len(set(ids)) == EVENTS
    seen: dict[str, list[int]] = {}
    for record in committed:
        body = json.loads(record.value or b"")
        assert record.key == body["g"].encode()
        seen.setdefault(body["g"], []).append(body["total"])
    assert {g: sorted(t) for g, t in seen.items()} == {
        g: list(range(1, n + 1)) for g, n in truth_groups.items()
    }
