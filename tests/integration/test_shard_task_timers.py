"""One shard task on real Redis, without Spark: a firing that moves or deletes another due timer
of the same key wins over the batch's list of due timers (a tag names one timer; setting it
again moves it)."""

from __future__ import annotations

import json
from typing import Any

from millstream import Computation, Context, Record, Timer, Topology, kafka_source
from millstream.connectors.plan import BatchPlan
from millstream.connectors.shard_task import run_shard
from millstream.records import TimeDomain
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.watermarks import Watermark

T0 = 1_700_000_000_000


class Canceller(Computation):
    """Timer "a" deletes "b" and moves "c" past the watermark; every firing is recorded."""

    def process_record(self, ctx: Context, record: Record) -> None:
        raise AssertionError("no records in this test")

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        fired = ctx.get_state([])
        ctx.set_state([*fired, timer.tag])
        if timer.tag == "a":
            ctx.delete_timer("b")
            ctx.set_timer("c", T0 + 60_000)


def test_a_timer_deleted_or_moved_by_an_earlier_firing_does_not_fire(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    topology = Topology(redis_namespace)
    topology.source("in", kafka_source("unused"))
    topology.computation("c", Canceller(), inputs=["in"], shards=1)
    spec = topology.computations["c"]
    keys = ShardKeys(redis_namespace, "c", 0)
    store = ShardStore(redis_client, keys, ShardConfig(), SoftStateCache())
    store.acquire()
    txn = store.begin()
    for tag, offset in (("a", 100), ("b", 200), ("c", 300)):
        txn.set_timer("k", tag, T0 + offset, TimeDomain.EVENT)
    store.commit(txn)

    plan = BatchPlan(
        app=redis_namespace,
        batch_id=1,
        redis_url=redis_url,
        shards=1,
        shard_config=ShardConfig(),
        input_watermark=Watermark(T0 + 1000, T0),
        gc_watermark=0,
        now=T0,
        user_retries=0,
        fail_stop=True,
        internal_inputs=frozenset(),
        deliveries={},
        in_flight_streams=frozenset(),
    )
    result = run_shard(plan, spec, 0, [])

    assert json.loads(redis_client.hget(keys.state, "k")) == ["a"]
    assert result.counters.get("timers_fired") == 1
    assert redis_client.zscore(keys.timers("event"), "k\x1fb") is None  # deleted by "a"
    assert redis_client.zscore(keys.timers("event"), "k\x1fc") == T0 + 60_000  # moved by "a"
