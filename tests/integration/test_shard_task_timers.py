"""One shard task on real Redis, without Spark: a firing that moves or deletes another due timer
of the same key wins over the batch's list of due timers (a tag names one timer; setting it
again moves it)."""

from __future__ import annotations

import json
from typing import Any

from millstream import Computation, Context, Record, Timer, Topology, kafka_source
from millstream.connectors.plan import BatchPlan, TaskInput
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


class Windows(Computation):
    """Counts per 1 s window; the window's timer emits the count and the watermark it saw."""

    def process_record(self, ctx: Context, record: Record) -> None:
        window = record.timestamp - record.timestamp % 1000
        counts = ctx.get_state({})
        counts[str(window)] = counts.get(str(window), 0) + 1
        ctx.set_state(counts)
        ctx.set_timer(str(window), window + 1000)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        n = counts.pop(timer.tag, 0)
        ctx.set_state(counts)
        ctx.produce("out", ctx.key, {"w": int(timer.tag), "n": n, "wm": ctx.low_watermark})


def _row(key: str, ts: int, offset: int) -> TaskInput:
    row = ("in", offset.to_bytes(8, "big"), key.encode(), b"x", ts, ts, "t", 0, offset, [], None)
    return TaskInput(key=key, row=row, error=None)


def _plan(app: str, redis_url: str, before: int, end: int | None, batch_id: int) -> BatchPlan:
    return BatchPlan(
        app=app,
        batch_id=batch_id,
        redis_url=redis_url,
        shards=1,
        shard_config=ShardConfig(),
        input_watermark=Watermark(before, before),
        gc_watermark=0,
        now=T0 + 10_000,
        user_retries=0,
        fail_stop=True,
        internal_inputs=frozenset(),
        deliveries={},
        in_flight_streams=frozenset(),
        end_watermark=None if end is None else Watermark(end, end),
    )


def test_timers_due_at_the_batch_end_watermark_fire_after_its_records(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    """A window whose end the batch's end watermark passed closes in this batch, with the
    records of this batch counted; a later window stays open; without an end watermark the
    timer waits (the next batch's input watermark fires it)."""
    topology = Topology(redis_namespace)
    topology.source("in", kafka_source("unused"))
    topology.computation("w", Windows(), inputs=["in"], outputs=["out"], shards=1)
    spec = topology.computations["w"]
    keys = ShardKeys(redis_namespace, "w", 0)

    # Batch 1 has no end watermark: its records' window stays open.
    first = run_shard(
        _plan(redis_namespace, redis_url, T0, None, 1), spec, 0, [_row("k", T0 + 100, 0)]
    )
    assert first.counters.get("timers_fired") is None
    assert redis_client.zscore(keys.timers("event"), "k\x1f" + str(T0)) == T0 + 1000

    # Batch 2: more records of that window and one of the next, end watermark T0 + 1500.
    items = [_row("k", T0 + 200, 1), _row("k", T0 + 900, 2), _row("k", T0 + 1200, 3)]
    second = run_shard(_plan(redis_namespace, redis_url, T0 + 50, T0 + 1500, 2), spec, 0, items)
    assert second.counters.get("timers_fired") == 1
    assert second.counters.get("late") is None  # judged against the input watermark
    [produced] = second.outstanding
    assert json.loads(produced.value) == {"w": T0, "n": 3, "wm": T0 + 1500}
    assert produced.timestamp == T0 + 1000
    assert redis_client.zscore(keys.timers("event"), "k\x1f" + str(T0)) is None
    assert redis_client.zscore(keys.timers("event"), "k\x1f" + str(T0 + 1000)) == T0 + 2000
    assert json.loads(redis_client.hget(keys.state, "k")) == {str(T0 + 1000): 1}
