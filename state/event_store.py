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


CHUNK = 1000  # keys per script call: far below Lua's limit on unpacked arguments

# One command per hash tag and chunk, not one per event: a pipeline's per-command cost in the
# client (packing, parsing) was a fifth of a joiner's shard work. KEYS share one tag (one
# Cluster slot); ARGV[1] the TTL, ARGV[i + 1] KEYS[i]'s value. EVAL, not EVALSHA: a script
# cache a Redis restart emptied cannot fail a batch.
PUT_SCRIPT = """
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'EX', ARGV[1])
end
return #KEYS
"""
GET_SCRIPT = "return redis.call('MGET', unpack(KEYS))"


def _tag(id: str) -> int:
    return mmh3.hash(id, signed=False) % SPREAD


def _key(store: str, id: str, tag: int | None = None) -> str:
    return f"ms:{{{store}:{_tag(id) if tag is None else tag}}}:{id}"


def _by_tag(ids: Sequence[str]) -> dict[int, list[int]]:
    """Positions of `ids` per hash tag (`_chunks` cuts each into script calls)."""
    groups: dict[int, list[int]] = {}
    for index, id in enumerate(ids):
        groups.setdefault(_tag(id), []).append(index)
    return groups


def _chunks(indexes: list[int]) -> list[list[int]]:
    return [indexes[i : i + CHUNK] for i in range(0, len(indexes), CHUNK)]


def put(client: RedisClient, store: str, events: Sequence[tuple[str, bytes]], ttl_s: int) -> None:
    """Keep each (id, value) for `ttl_s` seconds; one round trip."""
    if not events:
        return
    pipe = client.pipeline(transaction=False)
    for tag, indexes in _by_tag([id for id, _ in events]).items():
        for chunk in _chunks(indexes):
            keys = [_key(store, events[i][0], tag) for i in chunk]
            # execute_command: a Cluster pipeline refuses its eval() method, not the command
            pipe.execute_command(
                "EVAL", PUT_SCRIPT, len(keys), *keys, ttl_s, *[events[i][1] for i in chunk]
            )
    pipe.execute()


def get(client: RedisClient, store: str, ids: Sequence[str]) -> list[bytes | None]:
    """Each id's value, None where not (or no longer) stored; one round trip."""
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    order: list[list[int]] = []
    for tag, indexes in _by_tag(ids).items():
        for chunk in _chunks(indexes):
            pipe.execute_command(
                "EVAL", GET_SCRIPT, len(chunk), *[_key(store, ids[i], tag) for i in chunk]
            )
            order.append(chunk)
    out: list[bytes | None] = [None] * len(ids)
    for chunk, values in zip(order, pipe.execute(), strict=True):
        for index, value in zip(chunk, values, strict=True):
            out[index] = cast(bytes | None, value)
    return out
