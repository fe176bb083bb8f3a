"""Computations added to and removed from a running application, on real Spark, Redis, Kafka.

`first` (injected input -> `mid`) and `second` (reads `mid`) start together in one fused
query, where `mid` never touches Kafka. `third`, added at run time to read `mid`, runs in a
query of its own: the running query is restarted from its checkpoint to write `mid` to its
topic as well, and `third` reads it from there (start="latest": what `first` produces from
then on). Removing `third` stops its query; removing `second` restarts the main query without
it. Ground truth is counted here from what was sent; every stage's state must equal it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, ConfigurationError, Context, Record, Topology, kafka_source
from millstream.state.keys import app_key
from tests.e2e.conftest import wait_until
from tests.e2e.test_options import _metric
from tests.e2e.test_options import _send as _send_keys
from tests.e2e.test_options import _states as _states_of


def _send(bootstrap: str, topic: str, n: int, first: int) -> Counter[str]:
    return _send_keys(bootstrap, topic, n, keys=7, first=first)


def _states(client: Any, app: str, comp: str) -> dict[str, int]:
    return _states_of(client, app, comp, SHARDS)


SHARDS = 2


class Forward(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)
        ctx.produce("mid", ctx.key, record.value)


class Tally(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def test_computations_added_and_removed_at_run_time_keep_everyone_exactly_once(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    topology = Topology(app_name)
    topology.source("input", kafka_source(topic, id_header="id"), max_out_of_order_ms=10_000)
    topology.computation("first", Forward(), inputs=["input"], outputs=["mid"])
    topology.computation("second", Tally(), inputs=["mid"])
    app = start_app(topology, shards=SHARDS)

    def counted(comp: str, n: int) -> None:
        wait_until(lambda: _metric(redis_client, app_name, comp, "records") >= n, 120, comp, app)

    one = _send(kafka_bootstrap, topic, 200, first=0)
    counted("second", 200)
    listed = Producer({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
    assert topology.topic_of("mid") not in listed.topics  # consumed only inside: no topic

    # Add `third`, reading `mid` from another query: main now writes `mid` to its topic.
    topology.computation("third", Tally(), inputs=["mid"], start="latest")
    app.start(["third"])
    assert sorted(app.runners) == ["main", "third"]
    wait_until(lambda: _metric(redis_client, app_name, "third", "batches") >= 1, 120, "third", app)
    two = _send(kafka_bootstrap, topic, 200, first=200)
    counted("second", 400)
    counted("third", 200)
    assert _states(redis_client, app_name, "first") == dict(one + two)
    assert _states(redis_client, app_name, "second") == dict(one + two)
    assert _states(redis_client, app_name, "third") == dict(two)
    # Entries in flight that `third` read past are retired (they would grow forever).
    consumed = redis_client.hgetall(app_key(app_name, "consumed", "third", "mid"))
    assert consumed
    for partition, offset in consumed.items():
        entries = app_key(app_name, "inflight", "mid", partition.decode())
        assert redis_client.zcount(entries, "-inf", int(offset) - 1) == 0, partition

    # `first` cannot go while `second` reads it; `third` can, and its query stops.
    with pytest.raises(ConfigurationError, match="read its output"):
        app.remove("first")
    third_query = app.runners["third"].query
    app.remove("third")
    assert sorted(app.runners) == ["main"] and not third_query.isActive
    # Removing `second` restarts main without it; `first` goes on from where it was.
    app.remove("second")
    assert app.runners["main"].order == ["first"]
    three = _send(kafka_bootstrap, topic, 100, first=400)
    counted("first", 500)
    assert _states(redis_client, app_name, "first") == dict(one + two + three)
    assert _states(redis_client, app_name, "second") == dict(one + two)
    assert _states(redis_client, app_name, "third") == dict(two)
    assert _metric(redis_client, app_name, "first", "duplicates") == 0
