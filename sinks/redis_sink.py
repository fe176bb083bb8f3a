"""Redis upserts that a replay cannot regress.

Each production's value goes to one Redis hash per key, stored with its version
(`order_by` time, then seq, then id). A Lua script writes only when the incoming version is
newer than the stored one, so re-delivering checkpointed productions after a crash, in any
order and any number of times, leaves every key at its newest value.

Layout of `{prefix}{key}` (a hash): `v` value, `sys` system time, `ts` event time, `seq`, `id`.
Read the value with `HGET key v`.

Single node or Redis Cluster (told apart by `millstream.state.client.connect`). Each upsert
touches one key, so no write spans hash slots and no MULTI is needed: exactly-once rests on
the version check alone, and a delivery cut short on some nodes is simply delivered again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

import redis

from millstream.errors import ConfigurationError, TransientError
from millstream.records import Production
from millstream.sinks._kafka import ProcessCache
from millstream.sinks.base import (
    SKIPPED_DELIVERED,
    SKIPPED_SUPERSEDED,
    Delivery,
    DeliveryReport,
    ShardRef,
    Sink,
)
from millstream.state.client import RedisClient, connect

_CLIENTS: ProcessCache[RedisClient] = ProcessCache()


class RedisSink(Sink):
    """Upsert each production's value under `key_for(production)` (default: prefix + key).

    Versions compare by `order_by` time ("system_time": checkpoint order, the default; or
    "event_time": the latest event wins), then seq, then id. Across shards the time decides,
    so clocks matter only for writes to one key from different shards within a millisecond.
    Give `redis_url` (picklable, so the sink can travel to Spark executors) or `client`; a
    Redis Cluster URL works as is.
    """

    # KEYS[1] value hash; ARGV[1] value, [2] system time, [3] event time, [4] seq, [5] id,
    # [6] ttl ms (0: none), [7] "sys" or "ts" (the primary version field).
    # Returns 1 written, 2 same version already stored (a replay), 0 stored version is newer.
    LUA_UPSERT = """
local cur = redis.call('HMGET', KEYS[1], ARGV[7], 'seq', 'id')
local incoming = ARGV[7] == 'sys' and ARGV[2] or ARGV[3]
if cur[1] then
  local t, nt = tonumber(cur[1]), tonumber(incoming)
  local s, ns = tonumber(cur[2]), tonumber(ARGV[4])
  if nt < t or (nt == t and ns < s) then return 0 end
  if nt == t and ns == s then
    if ARGV[5] == cur[3] then return 2 end
    if ARGV[5] < cur[3] then return 0 end
  end
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'sys', ARGV[2], 'ts', ARGV[3], 'seq', ARGV[4], 'id', ARGV[5])
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
return 1
"""
    UPSERT_SHA = hashlib.sha1(LUA_UPSERT.encode()).hexdigest()

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: RedisClient | None = None,
        prefix: str = "",
        key_for: Callable[[Production], str] | None = None,
        order_by: Literal["system_time", "event_time"] = "system_time",
        ttl_ms: int = 0,
    ) -> None:
        if (redis_url is None) == (client is None):
            raise ConfigurationError("RedisSink needs exactly one of redis_url or client")
        if order_by not in ("system_time", "event_time"):
            raise ConfigurationError(f"order_by={order_by!r}: use 'system_time' or 'event_time'")
        if ttl_ms < 0:
            raise ConfigurationError(f"ttl_ms={ttl_ms} must be >= 0 (0 keeps values forever)")
        self._url = redis_url
        self._client = client
        self._prefix = prefix
        self._key_for = key_for
        self._primary = "sys" if order_by == "system_time" else "ts"
        self._ttl_ms = ttl_ms

    def __getstate__(self) -> dict[str, Any]:
        if self._client is not None:
            raise ConfigurationError(
                "a RedisSink built with client= cannot be shipped to Spark executors: "
                "build it with redis_url= instead"
            )
        return dict(self.__dict__)

    def setup(self) -> None:
        """Fail fast when Redis is unreachable or refuses scripts; load the upsert script
        (on every primary of a Cluster)."""
        try:
            client = self._redis()
            client.ping()
            client.script_load(self.LUA_UPSERT)
        except (redis.RedisError, TransientError) as exc:
            raise ConfigurationError(
                f"Redis for the sink is unusable ({exc}): check the URL, that Redis runs, and "
                "that the user may run SCRIPT LOAD, EVALSHA, HSET, HMGET and PEXPIRE"
            ) from None

    def deliver(self, shard: ShardRef, productions: Sequence[Production]) -> DeliveryReport:
        if not productions:
            return DeliveryReport(shard)
        client = self._redis()
        keys = [self._key(p) for p in productions]
        try:
            results = self._upsert(client, keys, productions)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TransientError(
                f"shard {shard}: Redis sink unavailable ({exc}); retry later"
            ) from None
        except redis.RedisError as exc:
            raise ConfigurationError(
                f"shard {shard}: Redis sink rejected the upsert ({exc})"
            ) from None
        reason = {1: None, 2: SKIPPED_DELIVERED, 0: SKIPPED_SUPERSEDED}
        return DeliveryReport.build(
            shard,
            (
                (p, Delivery(p.id, p.seq, key, skipped=reason[int(r)]))
                for key, p, r in zip(keys, productions, results, strict=True)
            ),
        )

    def close(self) -> None:
        if self._url is not None:
            client = _CLIENTS.pop(self._url)
            if client is not None:
                client.close()

    def _key(self, production: Production) -> str:
        if self._key_for is not None:
            return self._key_for(production)
        return f"{self._prefix}{production.key}"

    def _upsert(
        self, client: RedisClient, keys: list[str], productions: Sequence[Production]
    ) -> list[Any]:
        """One pipelined EVALSHA per production; a Cluster pipeline sends each node its share.

        A node without the script (a restart, a failover, SCRIPT FLUSH) answers NOSCRIPT: load
        it again (on every primary) and run just those upserts once more. EVALSHA goes through
        `execute_command` because redis-py's Cluster pipeline blocks its `evalsha` method only
        for fear of missing scripts (redis-py #2914, lifted by #4206).
        """
        results: list[Any] = [None] * len(keys)
        pending = list(range(len(keys)))
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for i in pending:
                p = productions[i]
                args = (p.value, p.system_time, p.timestamp, p.seq, p.id, self._ttl_ms)
                pipe.execute_command("EVALSHA", self.UPSERT_SHA, 1, keys[i], *args, self._primary)
            missing = []
            for i, result in zip(pending, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(result, redis.exceptions.NoScriptError) and attempt == 0:
                    missing.append(i)
                elif isinstance(result, Exception):
                    raise result
                else:
                    results[i] = result
            if not missing:
                break
            client.script_load(self.LUA_UPSERT)
            pending = missing
        return results

    def _redis(self) -> RedisClient:
        if self._client is not None:
            return self._client
        assert self._url is not None
        client = _CLIENTS.get(self._url)
        if client is None:
            # Its own client, not the state layer's shared one: close() closes it.
            client = _CLIENTS.put(self._url, connect(self._url, cached=False))
        return client
