"""Photon's event store, cache tier (`state/event_store.py`), on a single Redis and a Cluster:
values come back in the order asked, missing ids as None, with the TTL set, across hash tags
and chunks; a write again (a replayed batch) changes nothing."""

from __future__ import annotations

from typing import Any

from millstream.state import event_store


def test_put_then_get_in_order_across_tags_and_chunks(
    store_client: Any, redis_namespace: str
) -> None:
    store = f"{redis_namespace}:es:joiner"
    events = [(f"q{i}", f"query {i}".encode()) for i in range(2 * event_store.CHUNK + 500)]
    event_store.put(store_client, store, events, 60)
    event_store.put(store_client, store, events[:10], 60)  # a replayed batch writes again
    asked = [f"q{i}" for i in range(0, len(events), 7)] + ["never-sent", "q3", "q3"]
    got = event_store.get(store_client, store, asked)
    want = dict(events)
    assert got == [want.get(id) for id in asked]
    assert got[-3] is None and got[-2] == got[-1] == b"query 3"
    ttl = store_client.ttl(event_store._key(store, "q1"))
    assert 0 < ttl <= 60
    assert event_store.get(store_client, store, []) == []
