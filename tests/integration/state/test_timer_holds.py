"""Watermark holds in the state layer, against real Redis (single node and Cluster).

A hold is persisted with its timer in the same guarded commit, counts as the shard's oldest
work until the timer fires, is deleted or is moved without a hold, and comes back with the
due timer so the firing knows its output time.
"""

from __future__ import annotations

from typing import Any

import pytest

from millstream.errors import FencedError
from millstream.records import TimeDomain
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache, oldest_work
from millstream.state.watermarks import NO_WORK

T0 = 1_700_000_000_000


def _store(client: Any, keys: ShardKeys) -> ShardStore:
    store = ShardStore(client, keys, ShardConfig(bucket_ms=60_000), SoftStateCache())
    store.acquire()
    return store


def _set(store: ShardStore, tag: str, time: int, hold: int | None) -> None:
    txn = store.begin()
    txn.set_timer("k", tag, time, TimeDomain.EVENT, hold)
    store.commit(txn)


def test_hold_is_oldest_work_until_the_timer_fires(store_client: Any, redis_namespace: str) -> None:
    keys = ShardKeys(redis_namespace, "c", 0)
    store = _store(store_client, keys)
    _set(store, "w", T0 + 1000, T0)
    assert oldest_work(store_client, [keys])[0].event == T0  # held below the timer's time

    _, due = store.load([], T0 + 999, 0)
    assert due == []  # the hold is passed, the timer is not due yet
    _, due = store.load([], T0 + 1000, 0)
    assert [(t.tag, t.time, t.hold, t.output_time) for t in due] == [("w", T0 + 1000, T0, T0)]

    fire = store.begin()  # what the runtime does when the timer fires
    fire.delete_timer("k", "w")
    store.commit(fire)
    assert store_client.zcard(keys.timer_holds) == 0
    assert oldest_work(store_client, [keys]) == [NO_WORK]


def test_hold_is_released_on_delete_and_on_a_move_without_hold(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 1)
    store = _store(store_client, keys)
    _set(store, "a", T0 + 1000, T0)
    _set(store, "b", T0 + 2000, T0 + 500)
    assert oldest_work(store_client, [keys])[0].event == T0

    _set(store, "a", T0 + 1000, None)  # moved (same time) without a hold
    assert oldest_work(store_client, [keys])[0].event == T0 + 500

    txn = store.begin()
    txn.delete_timer("k", "b")
    store.commit(txn)
    assert store_client.zcard(keys.timer_holds) == 0
    assert oldest_work(store_client, [keys])[0].event == T0 + 1000  # timer a's own time
    _, due = store.load([], T0 + 1000, 0)
    assert [(t.tag, t.hold) for t in due] == [("a", None)]


def test_a_fenced_commit_writes_no_hold(store_client: Any, redis_namespace: str) -> None:
    keys = ShardKeys(redis_namespace, "c", 2)
    zombie = _store(store_client, keys)
    txn = zombie.begin()
    txn.set_timer("k", "w", T0 + 1000, TimeDomain.EVENT, T0)
    _store(store_client, keys)  # a newer owner
    with pytest.raises(FencedError):
        zombie.commit(txn)
    assert store_client.zcard(keys.timer_holds) == 0
    assert oldest_work(store_client, [keys]) == [NO_WORK]


def test_hold_survives_in_the_store_for_a_new_owner(
    store_client: Any, redis_namespace: str
) -> None:
    keys = ShardKeys(redis_namespace, "c", 3)
    _set(_store(store_client, keys), "w", T0 + 1000, T0 + 10)
    _, due = _store(store_client, keys).load([], T0 + 5000, 0)  # another process, after a crash
    assert [(t.tag, t.hold) for t in due] == [("w", T0 + 10)]


def test_transaction_refuses_a_hold_after_the_time_or_on_a_wall_timer(
    store_client: Any, redis_namespace: str
) -> None:
    store = _store(store_client, ShardKeys(redis_namespace, "c", 4))
    txn = store.begin()
    with pytest.raises(ValueError):
        txn.set_timer("k", "w", T0, TimeDomain.EVENT, T0 + 1)
    with pytest.raises(ValueError):
        txn.set_timer("k", "w", T0, TimeDomain.WALL, T0)
