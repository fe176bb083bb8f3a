"""Photon's event store, cache tier: secondary events (queries) by id, kept for a TTL.

A join's store computation writes each secondary event here as it arrives; the joiner looks
up a shard batch's primary events (clicks) in one pipelined round trip. A write is idempotent
(the same id, the same bytes), so a batch replayed after a crash writes again harmlessly. One
key per event, `ms:{<app>:es:<join>:<n>}:<id>` (n = mmh3(id) mod 16): inside the
application's key prefix (`millstream reset` removes them, the README's ACL line covers them),
and spread over 16 slots of a Redis Cluster (a pipeline groups them per node). Behind it is
Photon's log tier (`connectors/join_log.py`, `injectors/event_log.py`): a query the cache no
longer holds (older than the TTL) is read from the secondary stream's topics around its time,
and put back here for the clicks that follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import mmh3

from millstream.state.client import RedisClient

SPREAD = 16  # hash tags per store: a Cluster spreads the events over this many slots


def _key(store: str, id: str) -> str:
    return f"ms:{{{store}:{mmh3.hash(id, signed=False) % SPREAD}}}:{id}"


def put(client: RedisClient, store: str, events: Sequence[tuple[str, bytes]], ttl_s: int) -> None:
    """Keep each (id, value) for `ttl_s` seconds; one round trip."""
    if not events:
        return
    pipe = client.pipeline(transaction=False)
    for id, value in events:
        pipe.set(_key(store, id), value, ex=ttl_s)
    pipe.execute()


def get(client: RedisClient, store: str, ids: Sequence[str]) -> list[bytes | None]:
    """Each id's value, None where not (or no longer) stored; one round trip."""
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for id in ids:
        pipe.get(_key(store, id))
    return cast(list[bytes | None], pipe.execute())
