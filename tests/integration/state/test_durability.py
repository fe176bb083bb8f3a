"""With appendonly yes and appendfsync always, a Redis kill -9 loses no committed state."""

from __future__ import annotations

from typing import Any

from millstream.records import Production, TimeDomain
from millstream.state.catalog import Verdict
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache


def test_kill9_and_restart_loses_no_commit(durable_redis: Any) -> None:
    keys = ShardKeys("durable", "c", 0)
    client = connect(durable_redis.url, cached=False)
    store = ShardStore(client, keys, ShardConfig(), SoftStateCache())
    store.acquire()
    txn = store.begin()
    for i in range(200):
        txn.set_state(f"k{i}", str(i).encode())
    txn.set_timer("k1", "t", 1234, TimeDomain.EVENT)
    txn.add_ids([(0, f"r{i}".encode(), b"p") for i in range(200)])
    txn.checkpoint(Production("out", "k", b"v", 5, b"pid", 5))
    store.commit(txn)
    client.close()

    durable_redis.kill9()
    durable_redis.restart()

    client = connect(durable_redis.url, cached=False)
    assert client.hlen(keys.state) == 200
    assert client.hget(keys.state, "k199") == b"199"
    again = ShardStore(client, keys, ShardConfig(), SoftStateCache())
    again.acquire()
    assert [p.id for p in again.pending_productions()] == [b"pid"]
    assert again.dedup([(b"r7", 0, b"p"), (b"fresh", 0, b"p")], 0) == [Verdict.REPLAY, Verdict.NEW]
    _, due = again.load([], 2000, 0)
    assert [t.tag for t in due] == ["t"]
    client.close()
