"""Sequencers: a per-shard token that fences every older owner the moment a new one acquires.

MillWheel section 6.1.2: a zombie writer must not apply effects. Acquiring INCRs the shard's
sequencer; the new value is this owner's token. Every commit WATCHes the sequencer and checks
the token (`guarded`), so once a newer owner acquired the shard, an older owner's EXEC writes
nothing. A moved lease is never retried here: it surfaces as FencedError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from millstream.errors import FencedError
from millstream.state.client import RedisClient, RedisPipeline
from millstream.state.keys import ShardKeys


@dataclass(frozen=True, slots=True)
class Lease:
    keys: ShardKeys
    token: int


# A rescale's tombstone on the sequencer of a shard it moved away from (`state/rescale.py`):
# INCR refuses it, so no owner of the old layout acquires the shard again.
RETIRED = "retired"

# (lease token, shard version, next production seq) as an owner left them: enough for another
# process (the driver, which delivers what a shard task committed) to commit under that lease.
# A plain tuple: it travels in pickled shard results from Spark tasks to the driver.
Position = tuple[int, int, int]


def acquire(client: RedisClient, keys: ShardKeys) -> Lease:
    """Take the shard: every older owner is fenced from now on (no waiting for a timeout)."""
    lease, _ = acquire_and_read(client, keys, lambda pipe: None)
    return lease


def acquire_and_read(
    client: RedisClient, keys: ShardKeys, reads: Callable[[RedisPipeline], None]
) -> tuple[Lease, list[Any]]:
    """`acquire`, with the reads `reads` queues on the same pipeline: one round trip.

    Returns the lease and the replies to those reads, in order. The reads are not atomic with
    the INCR; what they return is current only as long as the lease is, which every commit checks.
    """
    pipe = client.pipeline(transaction=False)
    pipe.incr(keys.sequencer)
    reads(pipe)
    try:
        token, *replies = pipe.execute()
    except redis.ResponseError:
        if _retired(client.get(keys.sequencer)):
            raise FencedError(_retired_message(keys)) from None
        raise
    return Lease(keys, int(token)), replies


def _retired(value: Any) -> bool:
    return value is not None and (value.decode() if isinstance(value, bytes) else value) == RETIRED


def _retired_message(keys: ShardKeys) -> str:
    return (
        f"shard {keys.tag} was retired by a rescale: its keys moved to another shard layout, "
        "and no owner of the old one may commit"
    )


@contextmanager
def guarded(client: RedisClient, lease: Lease) -> Iterator[RedisPipeline]:
    """A MULTI pipeline whose EXEC applies only while `lease` is the shard's current lease.

    1. WATCH the shard's sequencer and check it still holds the lease's token; a newer token
       means a newer owner: FencedError, and nothing is queued.
    2. MULTI, then yield the pipeline: the caller queues its writes and calls `execute()`.
    3. If the sequencer moved between WATCH and EXEC, Redis discards the transaction and
       redis-py raises WatchError, which leaves here as FencedError.
    """
    keys = lease.keys
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(keys.sequencer)
        current = pipe.get(keys.sequencer)
        if _retired(current):
            raise FencedError(_retired_message(keys))
        if current is None or int(current) != lease.token:
            raise FencedError(
                f"shard {keys.tag} lease moved to token {current!r}; "
                f"this owner holds {lease.token}: its commit is discarded"
            )
        pipe.multi()
        try:
            yield pipe
        except redis.WatchError:
            raise FencedError(
                f"shard {keys.tag} was acquired by a newer owner during commit; discarded"
            ) from None
