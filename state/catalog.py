"""The catalog of applied record ids: dedup verdicts, catalog writes, bucket garbage collection.

Per shard, one hash per system-time bucket maps every applied record id to the position it was
delivered from, and a sorted set indexes the live buckets. Ids enter the catalog in the same
lease-guarded commit as their effects (`queue_writes`, called by `ShardTransaction`), so a later
delivery of an id finds it: a duplicate the source sent (another position) or a replay of the
same delivery (a batch re-run after a failure). Time-bucketed Bloom filters, soft state in
worker memory, answer "certainly new" for almost every id; only "maybe" answers read the
catalog, in one pipelined round trip per batch. A bucket is dropped whole, with its filter,
once the garbage-collection watermark has passed it; a record older than that watermark is a
known duplicate (a network remnant).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.typing import EncodableT, FieldT

from millstream.state import _codec
from millstream.state.bloom import BucketedBloom
from millstream.state.client import RedisClient, RedisPipeline
from millstream.state.keys import ShardKeys


class Verdict(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"  # the id was applied before, delivered from another position
    REPLAY = "replay"  # the same delivery again (a batch re-run after a failure)
    REMNANT = "remnant"  # older than the GC watermark: a known duplicate, dropped and counted


@dataclass
class DedupStats:
    checked: int = 0
    duplicates: int = 0
    replays: int = 0
    remnants: int = 0
    catalog_reads: int = 0
    lookups_avoided: int = 0
    false_positives: int = 0


class Catalog:
    """One shard's catalog as seen by the owner that acquired it (held by `ShardStore`).

    `live_buckets` is read with the acquisition (`queue_live_buckets`, `set_live_buckets`);
    `round_trips` counts the catalog reads this object made.
    """

    def __init__(self, client: RedisClient, keys: ShardKeys, bucket_ms: int) -> None:
        self.client = client
        self.keys = keys
        self.bucket_ms = bucket_ms
        self.live_buckets: list[int] = []
        self.stats = DedupStats()
        self.round_trips = 0

    def bucket_of(self, system_time: int) -> int:
        return system_time // self.bucket_ms

    # --- live buckets and Bloom filters -------------------------------------------------------
    def queue_live_buckets(self, pipe: RedisPipeline) -> None:
        pipe.zrange(self.keys.buckets, 0, -1, withscores=True)

    def set_live_buckets(self, reply: list[tuple[Any, float]]) -> None:
        """Take the reply to `queue_live_buckets`."""
        self.live_buckets = sorted(int(score) for _, score in reply)

    def prune(self, bloom: BucketedBloom) -> None:
        """Drop the filters of buckets that are no longer live (garbage-collected by any owner)."""
        live = set(self.live_buckets)
        for bucket in [b for b in bloom.filters if b not in live]:
            del bloom.filters[bucket]

    def load(self, bloom: BucketedBloom) -> None:
        """Add every id of every live bucket to `bloom`: one round trip, if any bucket is live.

        For a filter built from nothing (a process start, or a commit log trimmed past it).
        """
        if not self.live_buckets:
            return
        pipe = self.client.pipeline(transaction=False)
        for bucket in self.live_buckets:
            pipe.hkeys(self.keys.catalog(bucket))
        for bucket, members in zip(self.live_buckets, pipe.execute(), strict=True):
            bloom.add((bucket, m) for m in members)
        self.round_trips += 1

    # --- verdicts -----------------------------------------------------------------------------
    def dedup(
        self,
        records: Sequence[tuple[bytes, int, bytes]],
        gc_watermark: int,
        bloom: BucketedBloom | None,
    ) -> list[Verdict]:
        """Classify (id, system_time, position) triples; one catalog round trip for "maybe"s.

        An id is looked for in every live bucket, not only its own: a source may send the same
        id again with another system time. Without filters (`bloom` None) every live bucket is
        read for every id.

        The catalog remembers where each id was delivered from, so a batch replayed after a
        failure (same position) is told apart from a duplicate the source sent (new position).
        Duplicates inside the batch are caught too: the first delivery wins.
        """
        verdicts: list[Verdict] = [Verdict.NEW] * len(records)
        seen: dict[bytes, bytes] = {}
        candidates: list[int] = []
        for index, (rid, system_time, position) in enumerate(records):
            if system_time < gc_watermark:
                verdicts[index] = Verdict.REMNANT
            elif rid in seen:
                same = seen[rid] == position
                verdicts[index] = Verdict.REPLAY if same else Verdict.DUPLICATE
            else:
                seen[rid] = position
                candidates.append(index)
        ids = [records[i][0] for i in candidates]
        if bloom is not None:
            maybe = bloom.maybe_in_any(ids)
        else:  # no filters: every live bucket must be asked
            live = sorted(set(self.live_buckets) | {self.bucket_of(r[1]) for r in records})
            maybe = [list(live) for _ in ids]
        stats = self.stats
        stats.checked += len(records)
        stats.lookups_avoided += sum(1 for buckets in maybe if not buckets)
        by_bucket: dict[int, list[int]] = {}
        for index, buckets in zip(candidates, maybe, strict=True):
            for bucket in buckets:
                by_bucket.setdefault(bucket, []).append(index)
        if by_bucket:
            pipe = self.client.pipeline(transaction=False)
            order = list(by_bucket.items())
            for bucket, indexes in order:
                pipe.hmget(self.keys.catalog(bucket), [records[i][0] for i in indexes])
            self.round_trips += 1
            found: dict[int, bytes] = {}
            for (_, indexes), positions in zip(order, pipe.execute(), strict=True):
                for index, position in zip(indexes, positions, strict=True):
                    if position is not None:
                        found[index] = position
            read = {i for indexes in by_bucket.values() for i in indexes}
            stats.catalog_reads += len(read)
            stats.false_positives += len(read - set(found))
            for index, position in found.items():
                same = position == records[index][2]
                verdicts[index] = Verdict.REPLAY if same else Verdict.DUPLICATE
        stats.duplicates += sum(v is Verdict.DUPLICATE for v in verdicts)
        stats.replays += sum(v is Verdict.REPLAY for v in verdicts)
        stats.remnants += sum(v is Verdict.REMNANT for v in verdicts)
        return verdicts

    # --- garbage collection -------------------------------------------------------------------
    def gc_buckets(self, gc_watermark: int) -> list[int]:
        """Live buckets wholly older than the GC watermark: dropped whole in the next commit."""
        return [b for b in self.live_buckets if (b + 1) * self.bucket_ms <= gc_watermark]


# --- writes, queued in the shard's commit --------------------------------------------------
def queue_writes(
    pipe: RedisPipeline,
    keys: ShardKeys,
    ids: Sequence[tuple[int, bytes, bytes]],
    drop_buckets: Sequence[int],
) -> None:
    """Queue (bucket, id, position) entries and the whole buckets to drop in a MULTI."""
    by_bucket: dict[int, dict[FieldT, EncodableT]] = {}
    for bucket, rid, position in ids:
        by_bucket.setdefault(bucket, {})[rid] = position
    for bucket, entries in by_bucket.items():
        pipe.hset(keys.catalog(bucket), mapping=entries)
    if by_bucket:
        pipe.zadd(keys.buckets, {str(b): b for b in by_bucket})
    if drop_buckets:
        pipe.delete(*[keys.catalog(b) for b in drop_buckets])
        pipe.zrem(keys.buckets, *[str(b) for b in drop_buckets])


def pack_ids(ids: Sequence[tuple[int, bytes, bytes]]) -> bytes:
    """The (bucket, id) pairs of a commit, for its commit-log entry (other workers' filters)."""
    return _codec.pack([b.to_bytes(8, "big", signed=True) + rid for b, rid, _ in ids])


def unpack_ids(blob: bytes) -> list[tuple[int, bytes]]:
    """The (bucket, id) pairs `pack_ids` packed."""
    return [(int.from_bytes(x[:8], "big", signed=True), x[8:]) for x in _codec.unpack(blob)]
