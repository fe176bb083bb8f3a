"""The catalog of applied record ids: dedup verdicts, catalog writes, bucket garbage collection.

Per shard and system-time bucket, every applied record id is kept as a 16-byte packed entry (a
fingerprint of the id and a hash of the position it was delivered from, `catalog_entries.py`) in
one of 64 groups chosen by the id's hash: a field of the bucket's hash while the group is
small, its own string (appended to) once it grew; a sorted set indexes the live buckets.
Ids enter the catalog in the same lease-guarded commit as their effects (`queue_writes`, called
by `ShardTransaction`), so a later delivery of an id finds it: a duplicate the source sent
(another position) or a replay of the same delivery (a batch re-run after a failure).
Time-bucketed Bloom filters over the fingerprints, soft state in worker memory, answer
"certainly new" for almost every id; only "maybe" answers read the catalog, the groups they fall
in, in one pipelined round trip per batch. A bucket is dropped whole, with its filter, once the
garbage-collection watermark has passed it; a record older than that watermark is a known
duplicate (a network remnant). Buckets an older version wrote as hashes id -> position
(`ShardKeys.catalog`) are still read until garbage collection drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from millstream.state import catalog_entries as ce
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
    by_offset: int = 0  # decided by the shard's offset marks, not the catalog (offset_marks.py)


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
        self.legacy_buckets: set[int] = set()  # live buckets with an older version's hash
        self.stats = DedupStats()
        self.round_trips = 0

    def bucket_of(self, system_time: int) -> int:
        return system_time // self.bucket_ms

    # --- live buckets and Bloom filters -------------------------------------------------------
    def queue_live_buckets(self, pipe: RedisPipeline) -> None:
        pipe.zrange(self.keys.buckets, 0, -1, withscores=True)

    def set_live_buckets(self, reply: list[tuple[Any, float]]) -> None:
        """Take the reply to `queue_live_buckets`."""
        self.live_buckets = sorted({int(score) for _, score in reply})
        self.legacy_buckets = {int(s) for m, s in reply if not _text(m).startswith(PACKED)}

    def prune(self, bloom: BucketedBloom) -> None:
        """Drop the filters of buckets that are no longer live (garbage-collected by any owner)."""
        live = set(self.live_buckets)
        for bucket in [b for b in bloom.filters if b not in live]:
            del bloom.filters[bucket]

    def load(self, bloom: BucketedBloom) -> None:
        """Add every fingerprint of every live bucket to `bloom`: one round trip, if any bucket
        is live.

        For a filter built from nothing (a process start, or a commit log trimmed past it).
        """
        if not self.live_buckets:
            return
        pipe = self.client.pipeline(transaction=False)
        for bucket in self.live_buckets:
            _queue_bucket_read(pipe, self.keys, bucket)
        legacy = sorted(self.legacy_buckets)
        for bucket in legacy:
            pipe.hkeys(self.keys.catalog(bucket))
        replies = pipe.execute()
        step = 1 + ce.GROUPS
        for at, bucket in enumerate(self.live_buckets):
            blobs = _bucket_blobs(replies[at * step : (at + 1) * step])
            bloom.add((bucket, fp) for blob in blobs for fp in ce.fingerprints_in(blob))
        for bucket, ids in zip(legacy, replies[len(self.live_buckets) * step :], strict=True):
            bloom.add((bucket, ce.fingerprint(rid)[0]) for rid in ids)
        self.round_trips += 1

    # --- verdicts -----------------------------------------------------------------------------
    def dedup(
        self,
        records: Sequence[tuple[bytes, int, bytes]],
        gc_watermark: int,
        bloom: BucketedBloom | None,
        digests: Sequence[bytes] | None = None,
    ) -> list[Verdict]:
        """Classify (id, system_time, position) triples; one catalog round trip for "maybe"s.
        `digests`: the ids' `catalog_entries.digest`, if the caller has them.

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
        if digests is None:
            prints = {i: ce.fingerprint(records[i][0]) for i in candidates}
        else:
            prints = {i: ce.of_digest(digests[i]) for i in candidates}
        if bloom is not None:
            maybe = bloom.maybe_in_any([prints[i][0] for i in candidates])
        else:  # no filters: every live bucket must be asked
            live = sorted(set(self.live_buckets) | {self.bucket_of(r[1]) for r in records})
            maybe = [list(live) for _ in candidates]
        stats = self.stats
        stats.checked += len(records)
        stats.lookups_avoided += sum(1 for buckets in maybe if not buckets)
        by_bucket: dict[int, list[int]] = {}
        for index, buckets in zip(candidates, maybe, strict=True):
            for bucket in buckets:
                by_bucket.setdefault(bucket, []).append(index)
        if by_bucket:
            found = self._look_up(records, prints, by_bucket)
            read = {i for indexes in by_bucket.values() for i in indexes}
            stats.catalog_reads += len(read)
            stats.false_positives += len(read - set(found))
            for index, same in found.items():
                verdicts[index] = Verdict.REPLAY if same else Verdict.DUPLICATE
        stats.duplicates += sum(v is Verdict.DUPLICATE for v in verdicts)
        stats.replays += sum(v is Verdict.REPLAY for v in verdicts)
        stats.remnants += sum(v is Verdict.REMNANT for v in verdicts)
        return verdicts

    def _look_up(
        self,
        records: Sequence[tuple[bytes, int, bytes]],
        prints: dict[int, tuple[bytes, int]],
        by_bucket: dict[int, list[int]],
    ) -> dict[int, bool]:
        """Record index -> whether it was applied from the same position, for the records
        found in the buckets `by_bucket` names: one round trip, the groups concerned only."""
        pipe = self.client.pipeline(transaction=False)
        wanted = [
            (b, g) for b, indexes in by_bucket.items() for g in {prints[i][1] for i in indexes}
        ]
        for bucket, group in wanted:  # in the hash of small groups, or in a string
            pipe.hget(self.keys.catalog_groups(bucket), str(group))
            pipe.get(self.keys.catalog_group(bucket, group))
        legacy = [(b, indexes) for b, indexes in by_bucket.items() if b in self.legacy_buckets]
        for bucket, indexes in legacy:
            pipe.hmget(self.keys.catalog(bucket), [records[i][0] for i in indexes])
        replies = pipe.execute()
        self.round_trips += 1
        blobs = {
            w: (replies[2 * i] or b"") + (replies[2 * i + 1] or b"") for i, w in enumerate(wanted)
        }
        found: dict[int, bool] = {}
        for bucket, indexes in by_bucket.items():
            for index in indexes:
                fp, group = prints[index]
                blob = blobs[(bucket, group)]
                hashed = ce.find(blob, fp) if blob else None
                if hashed is not None:
                    found[index] = hashed == ce.position_hash(records[index][2])
        for (_, indexes), positions in zip(legacy, replies[2 * len(wanted) :], strict=True):
            for index, position in zip(indexes, positions, strict=True):
                if position is not None:
                    found[index] = position == records[index][2]
        return found

    # --- garbage collection -------------------------------------------------------------------
    def gc_buckets(self, gc_watermark: int) -> list[int]:
        """Live buckets wholly older than the GC watermark: dropped whole in the next commit."""
        return [b for b in self.live_buckets if (b + 1) * self.bucket_ms <= gc_watermark]


# --- writes, queued in the shard's commit --------------------------------------------------
PACKED = "p"  # the live-bucket index's member prefix for a bucket of packed entries

# Appends entries to a bucket's groups. KEYS[1]: the hash of small groups; KEYS[i + 1]: group
# i's string; ARGV[1]: the size at which a group moves to its string; ARGV[i + 1]: group i's
# field; ARGV[n + i + 1]: its entries. A small group is rewritten at its exact size in the hash
# (little per group: a slow application's buckets stay tight); a large one is appended to,
# never read: APPEND costs what it adds, though Redis then keeps up to twice a string's
# length allocated. EVAL, not EVALSHA: a script cache that a Redis restart emptied cannot fail
# a commit's EXEC.
APPEND_SCRIPT = """
local n, limit = #KEYS - 1, tonumber(ARGV[1])
for i = 1, n do
  local key, field, add = KEYS[i + 1], ARGV[i + 1], ARGV[n + i + 1]
  if redis.call('EXISTS', key) == 1 then
    redis.call('APPEND', key, add)
  else
    local small = redis.call('HGET', KEYS[1], field) or ''
    if #small + #add < limit then
      redis.call('HSET', KEYS[1], field, small .. add)
    else
      redis.call('SET', key, small .. add)
      redis.call('HDEL', KEYS[1], field)
    end
  end
end
return n
"""
MOVE_AT = 4096  # bytes (256 entries) at which a group moves from the hash to its own string


def bucket_keys(keys: ShardKeys, bucket: int) -> list[str]:
    """Every key a bucket's catalog may have: an older version's hash, then the packed ones."""
    strings = [keys.catalog_group(bucket, g) for g in range(ce.GROUPS)]
    return [keys.catalog(bucket), keys.catalog_groups(bucket), *strings]


def _queue_bucket_read(pipe: RedisPipeline, keys: ShardKeys, bucket: int) -> None:
    pipe.hvals(keys.catalog_groups(bucket))
    for group in range(ce.GROUPS):
        pipe.get(keys.catalog_group(bucket, group))  # not MGET: a Cluster pipeline refuses it


def _bucket_blobs(replies: list[Any]) -> list[bytes]:
    return [blob for blob in [*replies[0], *replies[1:]] if blob]


def read_bucket(client: RedisClient, keys: ShardKeys, bucket: int) -> list[bytes]:
    """The group blobs of a bucket's packed entries (tools, tests): one round trip."""
    pipe = client.pipeline(transaction=False)
    _queue_bucket_read(pipe, keys, bucket)
    return _bucket_blobs(pipe.execute())


def queue_writes(
    pipe: RedisPipeline,
    keys: ShardKeys,
    entries: Sequence[ce.Entry],
    drop_buckets: Sequence[int],
) -> None:
    """Queue the entries' appends (an EVAL per bucket) and the whole buckets to drop in a
    MULTI; a bucket is one DEL of all its keys."""
    by_bucket: dict[int, list[ce.Entry]] = {}
    for entry in entries:
        by_bucket.setdefault(entry[ce.BUCKET], []).append(entry)
    for bucket, bucket_entries in by_bucket.items():
        blobs = ce.group_blobs(bucket_entries)
        strings = [keys.catalog_group(bucket, g) for g in blobs]
        # execute_command: a Cluster pipeline refuses its eval() method, not the command
        pipe.execute_command(
            "EVAL", APPEND_SCRIPT, 1 + len(blobs), keys.catalog_groups(bucket), *strings,
            MOVE_AT, *[str(g) for g in blobs], *blobs.values(),
        )  # fmt: skip
    if by_bucket:
        pipe.zadd(keys.buckets, {f"{PACKED}{b}": b for b in by_bucket})
    if drop_buckets:
        pipe.delete(*[k for b in drop_buckets for k in bucket_keys(keys, b)])
        pipe.zrem(keys.buckets, *[m for b in drop_buckets for m in (str(b), f"{PACKED}{b}")])


def _text(member: bytes | str) -> str:
    return member.decode() if isinstance(member, bytes) else member
