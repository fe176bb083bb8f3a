"""RedisSink on a real Redis, single node and Cluster: replays, in any order, never regress a key."""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from millstream.errors import ConfigurationError
from millstream.records import Production
from millstream.sinks.base import SKIPPED_DELIVERED, SKIPPED_SUPERSEDED, ShardRef
from millstream.sinks.redis_sink import RedisSink
from millstream.state.client import connect, is_cluster

SHARD = ShardRef("app", "comp", 1)


@pytest.fixture(params=["single", "cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """(url, client) of a single Redis or a 3-master Redis Cluster: one suite for both."""
    if request.param == "single":
        url = request.getfixturevalue("redis_url")
    else:
        url = request.getfixturevalue("redis_cluster").url
    client = connect(url, cached=False)
    yield url, client
    client.close()


def production(
    key: str, seq: int, system_time: int, value: bytes, event_time: int = 0
) -> Production:
    return Production(
        stream="s",
        key=key,
        value=value,
        timestamp=event_time or 1_700_000_000_000 + seq,
        id=f"id-{key}-{seq}".encode(),
        system_time=system_time,
        seq=seq,
    )


def test_replay_of_older_values_never_regresses(
    store: tuple[str, Any], redis_namespace: str
) -> None:
    redis_url, redis_client = store
    sink = RedisSink(redis_url, prefix=f"{redis_namespace}:")
    sink.setup()
    history = [production(f"k{seq % 5}", seq, 1000 + seq, f"v{seq}".encode()) for seq in range(40)]
    report = sink.deliver(SHARD, history)
    assert report.delivered == 40
    newest = {p.key: p for p in history}  # seq order: the last per key wins

    # replays after crashes: any subset, any order, several times
    rng = random.Random(7)
    for _ in range(5):
        replay = rng.sample(history, 25)
        again = sink.deliver(SHARD, replay)
        assert again.delivered == 0
        for d in again.deliveries:
            assert d.skipped in (SKIPPED_DELIVERED, SKIPPED_SUPERSEDED)
    for key, p in newest.items():
        stored = redis_client.hgetall(f"{redis_namespace}:{key}")
        assert stored[b"v"] == p.value
        assert int(stored[b"seq"]) == p.seq and stored[b"id"] == p.id
    # replaying the newest value itself is recognised as already delivered
    assert {d.skipped for d in sink.deliver(SHARD, list(newest.values())).deliveries} == {
        SKIPPED_DELIVERED
    }
    # a genuinely newer value still lands
    newer = production("k0", 41, 2000, b"newer")
    assert sink.deliver(SHARD, [newer]).delivered == 1
    assert redis_client.hget(f"{redis_namespace}:k0", "v") == b"newer"
    sink.close()


def test_event_time_order_and_ttl(store: tuple[str, Any], redis_namespace: str) -> None:
    redis_url, redis_client = store
    sink = RedisSink(redis_url, prefix=f"{redis_namespace}:", order_by="event_time", ttl_ms=60_000)
    late_event = production("k", 2, system_time=5000, value=b"old-event", event_time=100)
    early_event = production("k", 1, system_time=4000, value=b"new-event", event_time=200)
    sink.deliver(SHARD, [early_event, late_event])
    assert redis_client.hget(f"{redis_namespace}:k", "v") == b"new-event"
    assert 0 < redis_client.pttl(f"{redis_namespace}:k") <= 60_000
    sink.close()


def test_one_delivery_spans_nodes_and_reloads_a_lost_script(
    store: tuple[str, Any], redis_namespace: str
) -> None:
    """On Cluster one delivery writes keys on every master (a plain client stopped at the first
    MOVED reply); a node that lost the script (restart, failover, SCRIPT FLUSH) is given it
    again, and what then lands is reported as written, not as already delivered."""
    redis_url, client = store
    sink = RedisSink(redis_url, prefix=f"{redis_namespace}:")
    sink.setup()
    keys = [f"{redis_namespace}:k{i}" for i in range(30)]
    first = [production(f"k{i}", i, 1000 + i, b"first") for i in range(30)]
    assert sink.deliver(SHARD, first).delivered == 30
    if is_cluster(client):
        assert len({client.get_node_from_key(key).name for key in keys}) == 3
    client.script_flush()
    assert client.script_exists(RedisSink.UPSERT_SHA) == [False]
    second = [production(f"k{i}", 100 + i, 2000 + i, b"second") for i in range(30)]
    report = sink.deliver(SHARD, second)
    assert (report.delivered, report.skipped) == (30, 0)
    assert [client.hget(key, "v") for key in keys] == [b"second"] * 30
    assert sink.deliver(SHARD, second).skipped == 30  # and a replay of it changes nothing
    sink.close()


def test_sink_travels_by_url_only(redis_url: str, redis_client: redis.Redis) -> None:
    by_url = pickle.loads(pickle.dumps(RedisSink(redis_url)))
    by_url.setup()
    with pytest.raises(ConfigurationError, match="redis_url"):
        pickle.dumps(RedisSink(client=redis_client))
    with pytest.raises(ConfigurationError, match="exactly one"):
        RedisSink()


def test_unreachable_redis_fails_setup_with_cause() -> None:
    sink = RedisSink("redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError, match="unusable"):
        sink.setup()
