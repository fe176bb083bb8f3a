"""The state layer's exactly-once contract, against real Redis (single node and Cluster)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from millstream.errors import FencedError
from millstream.records import Production, TimeDomain
from millstream.state.catalog import Verdict, bucket_keys, read_bucket
from millstream.state.catalog_entries import fingerprint, fingerprints_in
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache, oldest_work
from millstream.state.transaction import HOLD, TransactionStatus
from millstream.state.watermarks import NO_WORK, Watermark

BUCKET_MS = 60_000
T0 = 1_700_000_000_000


def _store(client: Any, keys: ShardKeys, cache: SoftStateCache | None = None) -> ShardStore:
    return ShardStore(client, keys, ShardConfig(bucket_ms=BUCKET_MS), cache or SoftStateCache())


def _cataloged(client: Any, keys: ShardKeys, bucket: int) -> set[bytes]:
    """The fingerprints in a bucket's packed catalog entries."""
    return {fp for blob in read_bucket(client, keys, bucket) for fp in fingerprints_in(blob)}


def _prod(pid: bytes, ts: int = T0) -> Production:
    return Production("out", "k", b"v-" + pid, ts, pid, T0)


def _apply(
    store: ShardStore, ids: list[bytes], system_time: int = T0, positions: list[bytes] | None = None
) -> list[Verdict]:
    """One batch: dedup, count the new records into state key 'n', commit with their ids.

    Each delivery comes from a new position unless `positions` says otherwise.
    """
    positions = positions or [uuid.uuid4().bytes for _ in ids]
    verdicts = store.dedup(
        list(zip(ids, [system_time] * len(ids), positions, strict=True)), gc_watermark=0
    )
    states, _ = store.load(["n"], 0, 0)
    new = [(i, p) for i, p, v in zip(ids, positions, verdicts, strict=True) if v is Verdict.NEW]
    txn = store.begin()
    txn.set_state("n", str(int(states.get("n") or 0) + len(new)).encode())
    txn.add_ids([(store.bucket_of(system_time), i, p) for i, p in new])
    store.commit(txn)
    return verdicts


def test_zombie_commit_is_fenced_and_writes_nothing(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 3)
    zombie = _store(store_client, keys)
    zombie.acquire()
    txn = zombie.begin()
    txn.set_state("k", b"zombie")
    txn.set_timer("k", "t", T0, TimeDomain.EVENT)
    txn.add_ids([(1, b"r1", b"p")])
    txn.checkpoint(_prod(b"p1"))

    owner = _store(store_client, keys)
    owner.acquire()  # newer token: the zombie is fenced from now on
    with pytest.raises(FencedError):
        zombie.commit(txn)
    assert txn.status is TransactionStatus.FENCED

    assert store_client.hget(keys.state, "k") is None
    assert store_client.zcard(keys.timers("event")) == 0
    assert _cataloged(store_client, keys, 1) == set()
    assert store_client.hlen(keys.productions) == 0
    assert oldest_work(store_client, [keys]) == [NO_WORK]
    # The owner is unaffected and commits.
    own = owner.begin()
    own.set_state("k", b"owner")
    owner.commit(own)
    assert store_client.hget(keys.state, "k") == b"owner"


def test_transaction_status_machine(store_client: Any, redis_namespace: str) -> None:
    store = _store(store_client, ShardKeys(redis_namespace, "c", 0))
    store.acquire()
    txn = store.begin()
    txn.set_state("k", b"1")
    store.commit(txn)
    assert txn.status is TransactionStatus.COMMITTED
    with pytest.raises(RuntimeError, match="committed"):
        txn.set_state("k", b"2")
    with pytest.raises(RuntimeError, match="committed"):
        txn.commit()


def test_duplicates_applied_once_everywhere(store_client: Any, redis_namespace: str) -> None:
    """Same batch, later batch, another worker, a restarted worker, after a takeover."""
    keys = ShardKeys(redis_namespace, "c", 1)
    worker_a, worker_b = SoftStateCache(), SoftStateCache()

    a = _store(store_client, keys, worker_a)
    a.acquire()
    assert _apply(a, [b"r1", b"r2", b"r1"]) == [Verdict.NEW, Verdict.NEW, Verdict.DUPLICATE]

    a = _store(store_client, keys, worker_a)  # later batch, same worker
    a.acquire()
    assert _apply(a, [b"r2", b"r3"]) == [Verdict.DUPLICATE, Verdict.NEW]

    b = _store(store_client, keys, worker_b)  # another worker: takes over and rebuilds
    b.acquire()
    assert b.soft is not None and b.soft.rebuilds == 1
    assert _apply(b, [b"r1", b"r3", b"r4"]) == [Verdict.DUPLICATE, Verdict.DUPLICATE, Verdict.NEW]

    a = _store(store_client, keys, worker_a)  # back to A: syncs from the commit log
    a.acquire()
    assert a.soft is not None and a.soft.synced_commits == 1 and a.soft.rebuilds == 1
    assert _apply(a, [b"r4", b"r5"]) == [Verdict.DUPLICATE, Verdict.NEW]

    restarted = _store(store_client, keys, SoftStateCache())  # a restarted process
    restarted.acquire()
    assert _apply(restarted, [b"r1", b"r2", b"r3", b"r4", b"r5"]) == [Verdict.DUPLICATE] * 5
    assert int(store_client.hget(keys.state, "n")) == 5


def test_replayed_batch_is_told_apart_from_source_duplicates(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 8)
    store = _store(store_client, keys)
    store.acquire()
    _apply(store, [b"a", b"b"], positions=[b"t:0:1", b"t:0:2"])
    store = _store(store_client, keys, SoftStateCache())
    store.acquire()
    verdicts = _apply(store, [b"a", b"b", b"b"], positions=[b"t:0:1", b"t:0:2", b"t:0:9"])
    assert verdicts == [Verdict.REPLAY, Verdict.REPLAY, Verdict.DUPLICATE]
    assert store.dedup_stats.replays == 2 and store.dedup_stats.duplicates == 1


def test_duplicate_with_another_system_time_is_caught(
    store_client: Any, redis_namespace: str
) -> None:
    """A client retry can carry the same id with a later system time (another bucket)."""
    keys = ShardKeys(redis_namespace, "c", 9)
    worker = SoftStateCache()
    store = _store(store_client, keys, worker)
    store.acquire()
    _apply(store, [b"order-1"], system_time=T0)
    for cache in (worker, SoftStateCache()):  # same worker, and a fresh one that rebuilds
        store = _store(store_client, keys, cache)
        store.acquire()
        later = T0 + 3 * BUCKET_MS
        assert store.dedup([(b"order-1", later, b"elsewhere")], 0) == [Verdict.DUPLICATE]


def test_remnant_behind_gc_watermark_dropped_and_counted(
    store_client: Any, redis_namespace: str
) -> None:
    store = _store(store_client, ShardKeys(redis_namespace, "c", 2))
    store.acquire()
    verdicts = store.dedup([(b"old", T0 - 10, b"x"), (b"new", T0 + 10, b"y")], gc_watermark=T0)
    assert verdicts == [Verdict.REMNANT, Verdict.NEW]
    assert store.dedup_stats.remnants == 1


def test_gc_drops_whole_buckets(store_client: Any, redis_namespace: str) -> None:
    keys = ShardKeys(redis_namespace, "c", 4)
    store = _store(store_client, keys)
    store.acquire()
    _apply(store, [b"a"], system_time=T0)
    _apply(store, [b"b"], system_time=T0 + 5 * BUCKET_MS)
    store = _store(store_client, keys)
    store.acquire()
    old_bucket = store.bucket_of(T0)
    assert store.gc_buckets(T0 + 2 * BUCKET_MS) == [old_bucket]
    txn = store.begin()
    txn.drop_buckets([old_bucket])
    store.commit(txn)
    assert not store_client.exists(*bucket_keys(keys, old_bucket))
    assert store_client.zrange(keys.buckets, 0, -1) == [
        f"p{store.bucket_of(T0 + 5 * BUCKET_MS)}".encode()
    ]
    assert _cataloged(store_client, keys, store.bucket_of(T0 + 5 * BUCKET_MS)) == {
        fingerprint(b"b")[0]
    }


def test_crash_between_commit_and_ack_redelivers_same_ids(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 5)
    first = _store(store_client, keys)
    first.acquire()
    txn = first.begin()
    made = [txn.checkpoint(_prod(f"p{i}".encode(), T0 + i)) for i in range(3)]
    first.commit(txn)
    # ... the process dies here, before delivery is acknowledged.
    second = _store(store_client, keys)
    second.acquire()
    pending = second.pending_productions()
    assert [p.id for p in pending] == [p.id for p in made]
    assert [p.seq for p in pending] == [0, 1, 2]
    assert pending == made
    assert oldest_work(store_client, [keys])[0].event == T0
    ack = second.begin()
    ack.ack(pending, pending)
    second.commit(ack)
    third = _store(store_client, keys)
    third.acquire()
    assert third.pending_productions() == []
    assert oldest_work(store_client, [keys]) == [NO_WORK]
    # Sequence numbers keep increasing for the next owner.
    txn = third.begin()
    assert txn.checkpoint(_prod(b"p9")).seq == 3


def test_timers_fire_in_order_once_and_survive_restart(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 6)
    store = _store(store_client, keys)
    store.acquire()
    txn = store.begin()
    txn.set_timer("k1", "b", T0 + 200, TimeDomain.EVENT)
    txn.set_timer("k1", "a", T0 + 100, TimeDomain.EVENT)
    txn.set_timer("k2", "w", T0 + 50, TimeDomain.WALL)
    store.commit(txn)

    restarted = _store(store_client, keys)  # a new process: timers come from Redis
    restarted.acquire()
    _, due = restarted.load([], event_watermark=T0 + 99, now=T0)
    assert due == []  # the event watermark has not passed any; the clock not the wall timer
    _, due = restarted.load([], event_watermark=T0 + 150, now=T0 + 60)
    from millstream.state.timers import firing_order

    fired = firing_order(due)
    assert [(t.key, t.tag, t.time) for t in fired] == [("k2", "w", T0 + 50), ("k1", "a", T0 + 100)]
    txn = restarted.begin()
    for timer in fired:
        txn.delete_timer(timer.key, timer.tag)
    restarted.commit(txn)
    again = _store(store_client, keys)
    again.acquire()
    _, due = again.load([], event_watermark=T0 + 1000, now=T0 + 1000)
    assert [(t.key, t.tag) for t in due] == [("k1", "b")]  # each fires once


def test_round_trips_constant_in_batch_size(store_client: Any, redis_namespace: str) -> None:
    trips = []
    for n in (10, 1000):
        store = _store(store_client, ShardKeys(redis_namespace, f"rt{n}", 0))
        store.acquire()
        ids = [f"{n}-{i}".encode() for i in range(n)]
        store.dedup([(i, T0, i) for i in ids], 0)
        store.load([f"k{i}" for i in range(n)], 0, 0)
        txn = store.begin()
        for i in range(n):
            txn.set_state(f"k{i}", b"1")
            txn.checkpoint(_prod(f"{n}-p{i}".encode()))
        txn.add_ids([(store.bucket_of(T0), i, i) for i in ids])
        store.commit(txn)
        trips.append(store.round_trips)
    assert trips[0] == trips[1] <= 6


def test_stale_owner_cannot_move_oldest_work(store_client: Any, redis_namespace: str) -> None:
    keys = ShardKeys(redis_namespace, "c", 7)
    owner = _store(store_client, keys)
    owner.acquire()
    txn = owner.begin()
    txn.set_timer("k", "t", T0 + 500, TimeDomain.EVENT)
    owner.commit(txn)
    stale = _store(store_client, keys)
    stale.acquire()
    owner2 = _store(store_client, keys)
    owner2.acquire()
    bad = stale.begin()
    bad.set_timer("k", "early", T0 - 10_000, TimeDomain.EVENT)
    with pytest.raises(FencedError):
        stale.commit(bad)
    assert oldest_work(store_client, [keys]) == [Watermark(T0 + 500, NO_WORK.system)]


def _holds(client: Any, keys: ShardKeys) -> tuple[list[Any], list[Any]]:
    return (
        client.zrange(keys.production_times, 0, -1, withscores=True),
        client.zrange(keys.production_system_times, 0, -1, withscores=True),
    )


def test_production_holds_are_the_earliest_pending_checkpoint(
    store_client: Any, redis_namespace: str
) -> None:
    """Pending checkpoints hold the shard's low watermark at their earliest event time and
    its consumers' catalog GC at their earliest system time: one member per hold, moved down
    by checkpoints and set afresh from what an acknowledgement leaves."""
    keys = ShardKeys(redis_namespace, "c", 2)
    store = _store(store_client, keys)
    store.acquire()

    def made(pid: bytes, ts: int, system_time: int) -> Production:
        return Production("out", "k", b"v", ts, pid, system_time)

    txn = store.begin()
    first = [
        txn.checkpoint(made(b"a", T0 + 5, T0 + 50)),
        txn.checkpoint(made(b"b", T0 + 1, T0 + 70)),
    ]
    store.commit(txn)
    assert _holds(store_client, keys) == ([(HOLD, T0 + 1)], [(HOLD, T0 + 50)])
    assert oldest_work(store_client, [keys]) == [Watermark(T0 + 1, T0 + 50)]

    txn = store.begin()  # a later commit: the holds only move down
    later = [txn.checkpoint(made(b"c", T0 + 3, T0 + 40)), txn.checkpoint(made(b"d", T0 + 9, T0))]
    store.commit(txn)
    assert oldest_work(store_client, [keys]) == [Watermark(T0 + 1, T0)]

    ack = store.begin()  # a part acknowledged: the holds of what is left
    ack.ack([first[1], later[1]], [*first, *later])
    store.commit(ack)
    assert _holds(store_client, keys) == ([(HOLD, T0 + 3)], [(HOLD, T0 + 40)])
    assert store_client.hlen(keys.productions) == 2

    ack = store.begin()
    ack.ack([first[0], later[0]], [first[0], later[0]])
    store.commit(ack)
    assert not store_client.exists(keys.production_times, keys.production_system_times)
    assert oldest_work(store_client, [keys]) == [NO_WORK]
    assert store_client.hlen(keys.productions) == 0


def test_an_older_versions_per_production_holds_are_replaced_on_acknowledgement(
    store_client: Any, redis_namespace: str
) -> None:
    """A shard checkpointed by a version that kept one hold member per production: the next
    owner sees the same oldest work, and its acknowledgement leaves the holds of what stays."""
    keys = ShardKeys(redis_namespace, "c", 3)
    old = _store(store_client, keys)
    old.acquire()
    txn = old.begin()
    made = [txn.checkpoint(_prod(f"p{i}".encode(), T0 + i)) for i in range(3)]
    old.commit(txn)
    store_client.delete(keys.production_times, keys.production_system_times)
    store_client.zadd(keys.production_times, {p.id: p.timestamp for p in made})
    store_client.zadd(keys.production_system_times, {p.id: p.system_time for p in made})

    owner = _store(store_client, keys)
    owner.acquire()
    pending = owner.pending_productions()
    assert pending == made
    assert oldest_work(store_client, [keys])[0].event == T0
    ack = owner.begin()
    ack.ack(pending[:2], pending)
    owner.commit(ack)
    assert _holds(store_client, keys) == ([(HOLD, T0 + 2)], [(HOLD, T0)])
