"""The packed record-id catalog against real Redis (single node and Cluster): its verdicts, with
and without Bloom filters, after a restart, across buckets, on buckets an older version wrote
as hashes, and its round trips."""

from __future__ import annotations

from typing import Any

import pytest

from millstream.state import _codec, catalog
from millstream.state.catalog import Verdict, bucket_keys, read_bucket
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache

BUCKET_MS = 60_000
T0 = 1_700_000_000_000
N, D, R, X = Verdict.NEW, Verdict.DUPLICATE, Verdict.REPLAY, Verdict.REMNANT


def _store(client: Any, keys: ShardKeys, cache: SoftStateCache, bloom: bool = True) -> ShardStore:
    store = ShardStore(client, keys, ShardConfig(bucket_ms=BUCKET_MS, use_bloom=bloom), cache)
    store.acquire()
    return store


def _commit(store: ShardStore, records: list[tuple[bytes, int, bytes]]) -> list[Verdict]:
    """Dedup `records` (id, system_time, position) and commit the new ones' ids."""
    verdicts = store.dedup(records, gc_watermark=T0)
    txn = store.begin()
    txn.add_ids(
        [
            (store.bucket_of(t), rid, pos)
            for (rid, t, pos), v in zip(records, verdicts, strict=True)
            if v is Verdict.NEW
        ]
    )
    store.commit(txn)
    return verdicts


@pytest.mark.parametrize("bloom", [True, False])
def test_verdicts(store_client: Any, redis_namespace: str, bloom: bool) -> None:
    keys = ShardKeys(redis_namespace, "c", 0)
    cache = SoftStateCache()
    first = [(f"r{i}".encode(), T0 + i, f"in:0:{i}".encode()) for i in range(300)]
    assert _commit(_store(store_client, keys, cache, bloom), first) == [N] * 300

    batch = [
        (b"r1", T0 + 1, b"in:0:1"),  # the same delivery again: a replay
        (b"r2", T0 + 2, b"in:1:77"),  # the source sent it again: a duplicate
        (b"r3", T0 + 2 * BUCKET_MS, b"in:1:78"),  # again, with a later system time (bucket)
        (b"new", T0 - 1, b"in:0:900"),  # before the GC watermark: a remnant
        (b"new2", T0 + 5, b"in:0:901"),
        (b"new2", T0 + 5, b"in:0:901"),  # in-batch replay
        (b"new2", T0 + 5, b"in:0:902"),  # in-batch duplicate
    ]
    expected = [R, D, D, X, N, R, D]
    assert _commit(_store(store_client, keys, cache, bloom), batch) == expected
    # A process restart: filters rebuilt from the packed entries (`Catalog.load`).
    restarted = _store(store_client, keys, SoftStateCache(), bloom)
    assert restarted.soft is not None and restarted.soft.rebuilds == 1
    again = [(b"r299", T0, b"in:0:299"), (b"new2", T0 + 9, b"in:0:901"), (b"r0", T0, b"o")]
    assert restarted.dedup([*batch[:3], *again], gc_watermark=T0) == [R, D, D, R, R, D]


def test_id_in_two_buckets_and_gc(store_client: Any, redis_namespace: str) -> None:
    """An id re-sent with another system time is a duplicate in the later bucket; once GC
    dropped the earlier one, whose keys are all gone, the later still knows it."""
    keys = ShardKeys(redis_namespace, "c", 1)
    cache = SoftStateCache()
    store = _store(store_client, keys, cache)
    _commit(store, [(b"a", T0, b"p1"), (b"b", T0, b"p2")])
    store = _store(store_client, keys, cache)
    late = T0 + 3 * BUCKET_MS
    assert _commit(store, [(b"a", late, b"p3"), (b"c", late, b"p4")]) == [D, N]
    store = _store(store_client, keys, cache)
    old = store.bucket_of(T0)
    assert store.gc_buckets(late) == [old]
    txn = store.begin()
    txn.drop_buckets([old])
    store.commit(txn)
    assert not store_client.exists(*bucket_keys(keys, old))
    store = _store(store_client, keys, SoftStateCache())
    assert store.catalog.live_buckets == [store.bucket_of(late)]
    assert store.dedup([(b"c", late, b"p4"), (b"b", late, b"p2")], late) == [R, N]


def test_lookup_is_one_round_trip_whatever_the_number_of_ids(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 2)
    cache = SoftStateCache()
    ids = [(f"r{i}".encode(), T0 + i % 3 * BUCKET_MS, b"p") for i in range(2000)]
    _commit(_store(store_client, keys, cache), ids)
    for n in (5, 2000):
        store = _store(store_client, keys, cache)
        before = store.round_trips
        assert store.dedup(ids[:n], T0) == [R] * n
        assert store.round_trips - before == 1
        assert store.dedup_stats.catalog_reads == n


def test_groups_that_grow_move_to_strings(
    store_client: Any, redis_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group outgrowing the hash of small groups moves to its own string, appended to from
    then on; verdicts, `load` and GC see both."""
    monkeypatch.setattr(catalog, "MOVE_AT", 24 * 16)  # ~1500 / 64 entries: some groups move
    keys = ShardKeys(redis_namespace, "c", 5)
    cache = SoftStateCache()
    ids = [(f"r{i}".encode(), T0, f"p{i}".encode()) for i in range(1500)]
    for start in range(0, 1500, 300):
        _commit(_store(store_client, keys, cache), ids[start : start + 300])
    bucket = T0 // BUCKET_MS
    small = store_client.hlen(keys.catalog_groups(bucket))
    moved = sum(store_client.exists(keys.catalog_group(bucket, g)) for g in range(64))
    assert small + moved == 64 and moved > 0 and small > 0, (small, moved)
    assert sum(len(b) for b in read_bucket(store_client, keys, bucket)) == 1500 * 16
    for bloom in (True, False):
        store = _store(store_client, keys, SoftStateCache(), bloom)
        assert store.dedup([*ids, (b"r7", T0, b"elsewhere"), (b"x", T0, b"p")], T0) == [
            *[R] * 1500,
            D,
            N,
        ]
    txn = store.begin()
    txn.drop_buckets([bucket])
    store.commit(txn)
    assert not store_client.exists(*bucket_keys(keys, bucket))


@pytest.mark.parametrize("bloom", [True, False])
def test_legacy_hash_bucket_still_answers_until_gc(
    store_client: Any, redis_namespace: str, bloom: bool
) -> None:
    """An application upgraded from the hash layout (id -> position per bucket, member
    "<bucket>" in the index) keeps dedup for the ids in its old buckets."""
    keys = ShardKeys(redis_namespace, "c", 3)
    store = _store(store_client, keys, SoftStateCache(), bloom)
    bucket = store.bucket_of(T0)
    store_client.hset(keys.catalog(bucket), mapping={b"old1": b"in:0:1", b"old2": b"in:0:2"})
    store_client.zadd(keys.buckets, {str(bucket): bucket})

    store = _store(store_client, keys, SoftStateCache(), bloom)  # filters from the legacy hash
    assert store.catalog.legacy_buckets == {bucket}
    records = [(b"old1", T0, b"in:0:1"), (b"old2", T0 + 1, b"in:9:9"), (b"n", T0, b"in:0:3")]
    assert _commit(store, records) == [R, D, N]  # "n" goes to packed entries, same bucket
    store = _store(store_client, keys, SoftStateCache(), bloom)
    assert store.dedup([*records, (b"old1", T0 + BUCKET_MS, b"x")], T0) == [R, D, R, D]

    txn = store.begin()
    txn.drop_buckets(store.gc_buckets(T0 + BUCKET_MS))
    store.commit(txn)
    assert not store_client.exists(*bucket_keys(keys, bucket))
    assert store_client.zcard(keys.buckets) == 0


def test_older_commit_log_entry_makes_the_reader_rebuild(
    store_client: Any, redis_namespace: str
) -> None:
    """A worker whose filters are current syncs from the commit log; an entry an older version
    wrote holds raw ids, not fingerprints, so it rebuilds from the catalog instead."""
    keys = ShardKeys(redis_namespace, "c", 4)
    cache = SoftStateCache()
    store = _store(store_client, keys, cache)
    _commit(store, [(b"a", T0, b"p")])
    bucket = store.bucket_of(T0)
    # An older version's commit: its hash bucket, its log entry, the version after.
    store_client.hset(keys.catalog(bucket), b"b", b"q")
    store_client.zadd(keys.buckets, {str(bucket): bucket})
    ids = _codec.pack([bucket.to_bytes(8, "big", signed=True) + b"b"])
    store_client.hset(keys.commit_log, "2", _codec.pack([ids, _codec.pack([])]))
    store_client.set(keys.version, 2)

    store = _store(store_client, keys, cache)
    assert store.soft is not None and store.soft.rebuilds == 2
    assert store.dedup([(b"a", T0, b"p"), (b"b", T0, b"q"), (b"c", T0, b"r")], T0) == [R, R, N]
