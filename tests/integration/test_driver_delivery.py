"""Delivery by the driver on real Redis and Kafka: checkpoints a shard task committed are
delivered through a transactional sink and acknowledged under the task's lease; when a newer
owner took the shard in between, the acknowledgement is refused, the checkpoints stay, and the
newer owner's delivery of them adds nothing to what a read_committed reader sees."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from millstream.connectors.delivery import Target
from millstream.connectors.driver import UserSink
from millstream.connectors.driver_delivery import DriverDelivery
from millstream.connectors.plan import BatchPlan
from millstream.connectors.shard_task import ShardResult
from millstream.records import Production
from millstream.sinks.kafka_transactional import KafkaTransactionalSink
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.watermarks import NONE_KNOWN, now_ms
from millstream.testing.committed_reader import read_committed

COMPUTATION = "counter"


def _plan(app: str, redis_url: str, sink: KafkaTransactionalSink) -> BatchPlan:
    return BatchPlan(
        app=app,
        batch_id=1,
        redis_url=redis_url,
        shards=2,
        shard_config=ShardConfig(),
        input_watermark=NONE_KNOWN,
        gc_watermark=0,
        now=now_ms(),
        user_retries=0,
        fail_stop=False,
        internal_inputs=frozenset(),
        deliveries={"out": (Target(UserSink(sink), 0),)},
        in_flight_streams=frozenset(),
        deliver_in_task=False,
    )


def _committed_shard(client: Any, app: str, shard: int, values: list[str]) -> ShardResult:
    """What a shard task hands back: its productions checkpointed under its lease."""
    store = ShardStore(client, ShardKeys(app, COMPUTATION, shard), cache=SoftStateCache())
    store.acquire()
    txn = store.begin()
    now = now_ms()
    for value in values:
        txn.checkpoint(Production("out", f"k{shard}", value.encode(), now, uuid.uuid4().bytes, now))
    store.commit(txn)
    return ShardResult(shard=shard, outstanding=txn.productions, lease=store.position())


def test_driver_delivers_and_acknowledges_under_the_task_lease(
    redis_client: Any,
    redis_url: str,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
) -> None:
    topic = kafka_topic_factory(partitions=2)
    sink = KafkaTransactionalSink({"bootstrap.servers": kafka_bootstrap}, topic)
    plan = _plan(redis_namespace, redis_url, sink)
    delivery = DriverDelivery(COMPUTATION, 2, redis_client)
    first = _committed_shard(redis_client, redis_namespace, 0, ["a0", "a1", "a2"])
    second = _committed_shard(redis_client, redis_namespace, 1, ["b0", "b1"])

    # A newer owner takes shard 1 after its task returned and before the driver acknowledges.
    newer = ShardStore(
        redis_client, ShardKeys(redis_namespace, COMPUTATION, 1), cache=SoftStateCache()
    )
    newer.acquire()

    counters = delivery.deliver(plan, [first, second, ShardResult(shard=2)])
    assert counters == {"delivered": 5, "redelivered": 0, "acks_fenced": 1}
    # Shard 0 is acknowledged: no checkpoint left, its committed counter says delivered.
    keys0 = ShardKeys(redis_namespace, COMPUTATION, 0)
    assert redis_client.hlen(keys0.productions) == 0
    assert int(redis_client.hget(keys0.counters, "delivered")) == 3
    # Shard 1's acknowledgement was refused: its checkpoints stay for the newer owner.
    keys1 = ShardKeys(redis_namespace, COMPUTATION, 1)
    assert redis_client.hlen(keys1.productions) == 2
    assert redis_client.hget(keys1.counters, "delivered") is None

    # The newer owner hands them back; the driver delivers again, the sink's progress skips
    # them, and this time the acknowledgement holds.
    again = ShardResult(shard=1, outstanding=newer.pending_productions(), lease=newer.position())
    assert delivery.deliver(plan, [again]) == {"delivered": 2, "redelivered": 0}
    assert redis_client.hlen(keys1.productions) == 0

    seen = Counter((r.value or b"").decode() for r in read_committed(kafka_bootstrap, topic))
    assert seen == Counter(["a0", "a1", "a2", "b0", "b1"])
