"""Moving a computation's keys between shard counts (`state/rescale.py`), on a real Redis
(single node and Cluster): every key's state, timers and holds land in the shard its hash
names; every applied id is still recognised (a replay as a replay, another position as a
duplicate) in the shard its key now routes to; counters add up; the old layout is fenced; a
move interrupted at any step and tried again gives the same result."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from millstream.errors import FencedError
from millstream.records import Production, TimeDomain
from millstream.state.catalog import Verdict
from millstream.state.keys import ShardKeys, shard_of
from millstream.state.lease import RETIRED
from millstream.state.rescale import MoveWaits, move, new_shard_sources
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.shard_count import (
    ShardLayout,
    read_layout,
    record_layout,
    retired_layouts_key,
)

BUCKET_MS = 60_000
T0 = 1_700_000_000_000
COMP = "counter"


class Crash(Exception):
    pass


def _store(client: Any, keys: ShardKeys) -> ShardStore:
    return ShardStore(client, keys, ShardConfig(bucket_ms=BUCKET_MS), SoftStateCache())


def _fill(client: Any, app: str, layout: ShardLayout, rng: random.Random) -> dict[str, Any]:
    """Commit 300 records of 60 keys the way shard tasks do; return what was committed."""
    truth: dict[str, Any] = {"state": {}, "ids": [], "timers": {}, "holds": {}, "records": 0}
    by_shard: dict[int, list[tuple[str, bytes, bytes, int]]] = {}
    for n in range(300):
        key = f"k{rng.randrange(60)}"
        when = T0 + rng.randrange(3) * BUCKET_MS  # ids in three catalog buckets
        record = (key, uuid.uuid4().bytes, f"topic:0:{n}".encode(), when)
        by_shard.setdefault(shard_of(key, layout.shards), []).append(record)
    for shard, records in by_shard.items():
        store = _store(client, ShardKeys(app, COMP, shard, layout.generation))
        store.acquire()
        txn = store.begin(batch_id=7)
        for key, rid, position, when in records:
            count = truth["state"].get(key, 0) + 1
            truth["state"][key] = count
            txn.set_state(key, str(count).encode())
            txn.set_timer(key, "close", when + 1000, TimeDomain.EVENT, hold=when)
            txn.set_timer(key, "gc", when + 5000, TimeDomain.WALL)
            truth["timers"][key] = when + 1000
            truth["holds"][key] = when
            truth["ids"].append((key, rid, position, when))
        txn.add_ids([(store.bucket_of(w), rid, p) for _, rid, p, w in records])
        txn.count("records", len(records))
        store.commit(txn)
        truth["records"] += len(records)
    return truth


def _check(client: Any, app: str, layout: ShardLayout, truth: dict[str, Any]) -> None:
    """Every key, timer, hold and id where the new layout routes its key; counters summed."""
    states: dict[str, int] = {}
    records = 0
    for keys in layout.keys(app, COMP):
        for key, raw in client.hgetall(keys.state).items():
            key = key.decode()
            assert shard_of(key, layout.shards) == keys.shard, key
            states[key] = int(raw)
        for member, score in client.zrange(keys.timers("event"), 0, -1, withscores=True):
            key, tag = member.decode().split("\x1f")
            assert shard_of(key, layout.shards) == keys.shard and tag == "close"
            assert int(score) == truth["timers"][key]
        for member, score in client.zrange(keys.timer_holds, 0, -1, withscores=True):
            assert int(score) == truth["holds"][member.decode().split("\x1f")[0]]
        assert client.zcard(keys.timers("wall")) == client.zcard(keys.timers("event"))
        records += int(client.hget(keys.counters, "records") or 0)
    assert states == truth["state"]
    assert records == truth["records"]
    # Each id, sent again to the shard its key now routes to: a replay from the same position,
    # a duplicate from another; an id never sent is new.
    by_shard: dict[int, list[tuple[bytes, int, bytes]]] = {}
    for key, rid, position, when in truth["ids"]:
        by_shard.setdefault(shard_of(key, layout.shards), []).append((rid, when, position))
    for shard, again in by_shard.items():
        store = _store(client, ShardKeys(app, COMP, shard, layout.generation))
        store.acquire()
        elsewhere = [(rid, when, b"other") for rid, when, _ in again]
        fresh = [(uuid.uuid4().bytes, T0, b"new")]
        verdicts = store.dedup([*again, *elsewhere, *fresh], gc_watermark=0)
        assert verdicts[: len(again)] == [Verdict.REPLAY] * len(again)
        assert verdicts[len(again) : -1] == [Verdict.DUPLICATE] * len(again)
        assert verdicts[-1] is Verdict.NEW


def test_new_shard_sources_follow_the_hash() -> None:
    assert new_shard_sources(8, 16, 11) == [3]  # a split: one source
    assert new_shard_sources(16, 4, 1) == [1, 5, 9, 13]  # a merge: four
    assert new_shard_sources(4, 6, 3) == [1, 3]  # neither: gcd 2
    for key in (f"k{i}" for i in range(500)):  # every key's old shard is among its sources
        for old, new in ((8, 16), (16, 4), (4, 6), (6, 4), (5, 7)):
            assert shard_of(key, old) in new_shard_sources(old, new, shard_of(key, new))


def test_rescale_8_16_4_6_moves_every_key_timer_and_id(
    store_client: Any, redis_namespace: str
) -> None:
    app = redis_namespace
    layout = record_layout(store_client, app, COMP, 8)
    truth = _fill(store_client, app, layout, random.Random(5))
    zombie = _store(store_client, ShardKeys(app, COMP, 0))
    zombie.acquire()  # an owner of the old layout, still around
    late = zombie.begin()
    late.set_state("k0", b"zombie")
    for shards in (16, 4, 6):
        old = layout
        layout = move(store_client, app, COMP, old, shards)
        assert layout == ShardLayout(shards, old.generation + 1)
        assert read_layout(store_client, app, COMP) == layout
        _check(store_client, app, layout, truth)
        for keys in old.keys(app, COMP):  # nothing left but the tombstones
            assert store_client.get(keys.sequencer) == RETIRED.encode()
            assert not store_client.exists(keys.state, keys.buckets, keys.counters)
        assert store_client.hget(retired_layouts_key(app), COMP) is None
    with pytest.raises(FencedError, match="retired by a rescale"):
        zombie.commit(late)
    with pytest.raises(FencedError, match="retired by a rescale"):
        _store(store_client, ShardKeys(app, COMP, 3)).acquire()
    # A start configured with the first count runs the layout the rescale wrote.
    assert record_layout(store_client, app, COMP, 8) == layout


@pytest.mark.parametrize("crash_at", ["rescale_after_retire", "rescale_after_shard_written"])
def test_a_move_interrupted_and_tried_again_gives_the_same_result(
    store_client: Any, redis_namespace: str, crash_at: str
) -> None:
    app = redis_namespace
    layout = record_layout(store_client, app, COMP, 8)
    truth = _fill(store_client, app, layout, random.Random(9))
    seen = []
    limit = {"rescale_after_retire": 1, "rescale_after_shard_written": 3}[crash_at]

    def fault(name: str) -> None:
        seen.append(name)
        if seen.count(crash_at) == limit:
            raise Crash(name)

    with pytest.raises(Crash):
        move(store_client, app, COMP, layout, 16, fault)
    assert read_layout(store_client, app, COMP) == layout  # not switched: the old one stands
    new = move(store_client, app, COMP, layout, 16)
    assert new == ShardLayout(16, 1)
    _check(store_client, app, new, truth)


def test_a_move_waits_while_old_shards_hold_productions(
    store_client: Any, redis_namespace: str
) -> None:
    app = redis_namespace
    layout = record_layout(store_client, app, COMP, 4)
    truth = _fill(store_client, app, layout, random.Random(3))
    store = _store(store_client, ShardKeys(app, COMP, 2))
    store.acquire()
    txn = store.begin()
    production = txn.checkpoint(Production("out", "k", b"v", T0, b"p1", T0))
    store.commit(txn)
    with pytest.raises(MoveWaits, match="not yet delivered"):
        move(store_client, app, COMP, layout, 8)
    assert read_layout(store_client, app, COMP) == layout
    store.acquire()  # the old layout still works: deliver and acknowledge, then move
    ack = store.begin()
    ack.ack([production], [production])
    store.commit(ack)
    new = move(store_client, app, COMP, layout, 8)
    _check(store_client, app, new, truth)
    # Seqs continue above every old shard's: a sink's progress per shard number stays behind.
    for keys in new.keys(app, COMP):
        assert int(store_client.get(keys.production_seq)) >= 1
