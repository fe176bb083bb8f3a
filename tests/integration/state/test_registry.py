"""The IdRegistry's contract (Photon, seed 004), on a single Redis and on a Redis Cluster.

Insert-if-absent with a token: the first insert wins, a retry with the same token gets "ours"
(also when the reply of the insert that applied was lost), any other token gets "theirs"; two
processes racing on the same 20,000 ids each win exactly the ids the other loses; buckets
expire `retention_days` after their event day; only the holder's token releases an id; one
pipelined round trip per call, whatever the number of ids.
"""

from __future__ import annotations

import multiprocessing
import socket
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any
from urllib.parse import urlparse

import pytest

from millstream.state.client import connect
from millstream.state.registry import DAY_MS, Claim, IdRegistry, Outcome, RegistryLayout

NOW = int(time.time() * 1000)


def registry(client: Any, **options: Any) -> IdRegistry:
    return IdRegistry(client, f"test{uuid.uuid4().hex[:10]}", **options)


def test_first_insert_wins_a_retry_is_ours_another_token_is_theirs(store_client: Any) -> None:
    reg = registry(store_client)
    first = reg.insert([Claim("click-1", NOW, "A|j|0|p1"), Claim("click-2", NOW, "A|j|1|p2")])
    assert [a.outcome for a in first] == [Outcome.INSERTED, Outcome.INSERTED]
    again = reg.insert(
        [
            Claim("click-2", NOW, "A|j|1|p2"),  # A's retry
            Claim("click-1", NOW, "B|j|3|p9"),  # the other pipeline
            Claim("click-3", NOW, "B|j|3|p10"),
        ]
    )
    assert [(a.outcome, a.holder) for a in again] == [
        (Outcome.OURS, "A|j|1|p2"),
        (Outcome.THEIRS, "A|j|0|p1"),
        (Outcome.INSERTED, "B|j|3|p10"),
    ]
    assert reg.holders([("click-1", NOW), ("click-3", NOW), ("click-4", NOW)]) == [
        "A|j|0|p1",
        "B|j|3|p10",
        None,
    ]


def _node_of(client: Any, url: str, key: str) -> tuple[str, int]:
    if hasattr(client, "get_node_from_key"):  # Redis Cluster: the node serving the key's slot
        node = client.get_node_from_key(key)
        return node.host, int(node.port)
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 6379


def _resp(*parts: Any) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def test_a_reply_lost_after_the_insert_applied_leaves_the_retry_ours(
    store_client: Any, request: pytest.FixtureRequest
) -> None:
    from millstream.state import registry as module

    url = request.getfixturevalue(
        "redis_url" if request.node.callspec.params["store_client"] == "single" else "redis_cluster"
    )
    url = url if isinstance(url, str) else url.url
    reg = registry(store_client)
    claim = Claim("click-lost", NOW, "A|j|0|p7")
    key = reg.bucket(claim.id, claim.event_ms)
    # The insert reaches Redis, the joiner never reads the reply (its connection dies).
    with socket.create_connection(_node_of(store_client, url, key), timeout=5) as raw:
        raw.sendall(
            _resp("EVAL", module._INSERT, 1, key, reg.expire_at(NOW), NOW, claim.id, claim.token)
        )
    deadline = time.monotonic() + 5
    while reg.holders([(claim.id, NOW)]) != [claim.token]:
        assert time.monotonic() < deadline, "the insert never applied"
        time.sleep(0.01)
    (retry,) = reg.insert([claim])
    assert retry.outcome is Outcome.OURS  # delivered: no lost output, no second one
    (other,) = reg.insert([Claim(claim.id, NOW, "B|j|2|p1")])
    assert other.outcome is Outcome.THEIRS


def _race(url: str, name: str, token: str, ids: list[str], start_at: float) -> list[str]:
    reg = IdRegistry(connect(url, cached=False), name)
    time.sleep(max(0.0, start_at - time.time()))  # both processes up: start together
    out: list[str] = []
    for start in range(0, len(ids), 500):
        claims = [Claim(i, NOW, token) for i in ids[start : start + 500]]
        out += [a.outcome.value for a in reg.insert(claims)]
    return out


def test_two_processes_racing_on_20k_ids_each_id_has_one_winner(
    store_client: Any, request: pytest.FixtureRequest
) -> None:
    single = request.node.callspec.params["store_client"] == "single"
    url = (
        request.getfixturevalue("redis_url")
        if single
        else request.getfixturevalue("redis_cluster").url
    )
    reg = registry(store_client)
    ids = [f"click-{n}" for n in range(20_000)]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        start_at = time.time() + 5
        a = pool.submit(_race, url, reg.name, "A", ids, start_at)
        b = pool.submit(_race, url, reg.name, "B", list(reversed(ids)), start_at)
        got_a, got_b = a.result(timeout=120), list(reversed(b.result(timeout=120)))
    winners = {"A": 0, "B": 0}
    for outcome_a, outcome_b in zip(got_a, got_b, strict=True):
        assert sorted((outcome_a, outcome_b)) == ["inserted", "theirs"]
        winners["A" if outcome_a == "inserted" else "B"] += 1
    assert winners["A"] > 0 and winners["B"] > 0, winners  # they really raced
    holders = reg.holders([(i, NOW) for i in ids])
    assert [h == "A" for h in holders] == [o == "inserted" for o in got_a]


def test_buckets_expire_retention_days_after_their_day(store_client: Any) -> None:
    reg = registry(store_client, retention_days=3)
    today = NOW // DAY_MS
    reg.insert([Claim("c", NOW, "A")])
    ttl = store_client.ttl(reg.bucket("c", NOW))
    day_end_s = (today + 1) * DAY_MS // 1000
    expected = day_end_s + 3 * 86_400 - int(time.time())
    assert abs(ttl - expected) <= 5, (ttl, expected)
    with pytest.raises(ValueError, match="older than the registry's 3-day retention"):
        reg.insert([Claim("old", NOW - 5 * DAY_MS, "A")])


def test_release_needs_the_holders_token(store_client: Any) -> None:
    reg = registry(store_client)
    reg.insert([Claim("orphan", NOW, "A|j|0|p1"), Claim("kept", NOW, "A|j|0|p2")])
    assert reg.release([Claim("orphan", NOW, "B|j|0|p1"), Claim("kept", NOW, "A|j|0|p9")]) == [
        False,
        False,
    ]
    assert reg.holders([("orphan", NOW), ("kept", NOW)]) == ["A|j|0|p1", "A|j|0|p2"]
    assert reg.release([Claim("orphan", NOW, "A|j|0|p1")]) == [True]
    (again,) = reg.insert([Claim("orphan", NOW, "B|j|0|p1")])  # recovered: joinable anew
    assert again.outcome is Outcome.INSERTED


class CountingClient:
    """The real client; counts pipelines executed and the commands each carried."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.round_trips: list[int] = []

    def pipeline(self, **options: Any) -> Any:
        pipe = self.client.pipeline(**options)
        execute = pipe.execute

        def counted() -> Any:
            self.round_trips.append(len(pipe.command_stack))
            return execute()

        pipe.execute = counted
        return pipe


@pytest.mark.parametrize("n", [10, 5_000])
def test_round_trips_do_not_grow_with_the_number_of_ids(store_client: Any, n: int) -> None:
    counting = CountingClient(store_client)
    reg = registry(counting, layout=RegistryLayout(((0, 8),)))
    reg.insert([Claim(f"c{i}", NOW, "A") for i in range(n)])
    reg.holders([(f"c{i}", NOW) for i in range(n)])
    reg.release([Claim(f"c{i}", NOW, "A") for i in range(n)])
    assert len(counting.round_trips) == 3  # one pipeline a call
    assert max(counting.round_trips) <= 8  # one command per touched bucket: 8 shards, one day


def test_layout_versions_keep_a_days_shard_count() -> None:
    layout = RegistryLayout(((0, 4), (20_000, 16)))
    assert layout.shards(19_999) == 4 and layout.shards(20_000) == 16
    with pytest.raises(ValueError, match="increasing first day"):
        RegistryLayout(((5, 4), (1, 8)))
    with pytest.raises(ValueError, match="at least one shard"):
        RegistryLayout(((0, 0),))
