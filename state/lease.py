"""Sequencers: a per-shard token that fences every older owner the moment a new one acquires.

MillWheel section 6.1.2: a zombie writer must not apply effects. Acquiring INCRs the shard's
sequencer; the new value is this owner's token. Every commit WATCHes the sequencer and checks
the token, so once a newer owner acquired the shard, an older owner's EXEC writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from millstream.state.client import RedisClient
from millstream.state.keys import ShardKeys


@dataclass(frozen=True, slots=True)
class Lease:
    keys: ShardKeys
    token: int


def acquire(client: RedisClient, keys: ShardKeys) -> Lease:
    """Take the shard: every older owner is fenced from now on (no waiting for a timeout)."""
    return Lease(keys, int(client.incr(keys.sequencer)))
