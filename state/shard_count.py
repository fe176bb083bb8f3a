"""The shard count of each computation, recorded at its first start and checked at every start.

A key's shard is `mmh3(key) mod S`. Starting again with another S sends keys to other shards:
their state, timers, pending productions and catalog entries stay behind in the old shards,
and replays are no longer recognised, so they are applied twice. Until rescaling exists, a
computation keeps the count it first started with, and a different one stops the start.
"""

from __future__ import annotations

from millstream.errors import ConfigurationError
from millstream.state.client import RedisClient
from millstream.state.keys import app_key


def shard_counts_key(app: str) -> str:
    """Hash computation -> shard count it first started with."""
    return app_key(app, "shards")


def record_shard_count(client: RedisClient, app: str, computation: str, shards: int) -> None:
    """Record `shards` for `computation` unless a count is recorded; raise if it differs.

    HSETNX makes concurrent first starts agree: the first writer's count stands, and every
    other start is checked against it. One round trip (both commands hit the same key).
    """
    key = shard_counts_key(app)
    pipe = client.pipeline(transaction=False)
    pipe.hsetnx(key, computation, shards)
    pipe.hget(key, computation)
    _, raw = pipe.execute()
    recorded = int(raw)
    if recorded != shards:
        raise ConfigurationError(
            f"computation {computation!r} of app {app!r} was started with {recorded} shards "
            f"and is now configured with {shards}: rescaling is not supported yet, so "
            f"configure shards={recorded} again (its `shards` option or MILLSTREAM_SHARDS); "
            f"to start over instead, use a new app name or `millstream reset {app} "
            f"--computation {computation}`"
        )
