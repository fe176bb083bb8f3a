"""A zombie shard task of an older micro-batch, fenced by the owner of a newer one, stops.

Two attempts of one shard run `run_shard` against real Redis (threads stand in for two Spark
Python workers). The first, of batch 0, stalls inside user code after acquiring the shard; a
task of batch 1 acquires it (fencing the first), commits and returns. When the first wakes, its
commit is fenced, and since the shard has committed a newer batch it must raise StaleBatchError
without acquiring the shard again (re-acquiring would fence batch 1's owner): the sequencer
stays where batch 1 left it and the state is batch 1's. A fenced task of the current batch
still starts over from acquire (tests/e2e/test_runtime_zombie.py).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from millstream import Computation, Context, Record, Topology, kafka_source
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.shard_task import run_shard
from millstream.errors import StaleBatchError
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import Watermark, now_ms

STALLED = threading.Event()
RELEASE = threading.Event()


class Stalling(Computation):
    """Counts records per key; a record whose value is b"stall" stalls until released."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"stall":
            STALLED.set()
            assert RELEASE.wait(30), "never released"
        ctx.set_state(ctx.get_state(0) + 1)


def _plan(app: str, redis_url: str, batch_id: int) -> BatchPlan:
    now = now_ms()
    return BatchPlan(
        app=app,
        batch_id=batch_id,
        redis_url=redis_url,
        shards=1,
        shard_config=ShardConfig(bucket_ms=60_000),
        input_watermark=Watermark(0, now),
        gc_watermark=0,
        now=now,
        user_retries=0,
        fail_stop=False,
        internal_inputs=frozenset(),
        deliveries={},
        in_flight_streams=frozenset(),
    )


def _item(rid: str, value: bytes, offset: int) -> TaskInput:
    row = ("in", rid.encode(), b"k", value, now_ms(), now_ms(), "t", 0, offset, None, None)
    return TaskInput("k", row, None)


def test_a_fenced_task_of_an_older_batch_stops_without_taking_the_shard_back(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    topology = Topology(redis_namespace)
    topology.source("in", kafka_source("unused"))
    topology.computation("c", Stalling(), inputs=["in"], shards=1)
    spec = topology.computations["c"]
    keys = ShardKeys(redis_namespace, "c", 0)
    outcome: dict[str, Any] = {}

    def zombie() -> None:
        try:
            outcome["zombie"] = run_shard(
                _plan(redis_namespace, redis_url, 0), spec, 0, [_item("r0", b"stall", 0)]
            )
        except Exception as exc:
            outcome["zombie"] = exc

    thread = threading.Thread(target=zombie)
    thread.start()
    assert STALLED.wait(30), "the batch-0 task never reached user code"
    current = run_shard(_plan(redis_namespace, redis_url, 1), spec, 0, [_item("r1", b"{}", 1)])
    assert current.counters["records"] == 1
    sequencer = int(redis_client.get(keys.sequencer))
    RELEASE.set()
    thread.join(30)

    assert isinstance(outcome["zombie"], StaleBatchError), outcome["zombie"]
    assert "batch 0" in str(outcome["zombie"]) and "batch 1" in str(outcome["zombie"])
    assert int(redis_client.get(keys.sequencer)) == sequencer, "the zombie took the shard back"
    assert json.loads(redis_client.hget(keys.state, "k")) == 1  # batch 1's effect only
    assert int(redis_client.get(keys.last_batch)) == 1


@pytest.fixture(autouse=True)
def _reset_events() -> None:
    STALLED.clear()
    RELEASE.clear()
