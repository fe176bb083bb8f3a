"""One shard's view of the store: acquire, sync soft state, dedup, read state and timers, commit.

The lease is `lease.py`'s and the record-id catalog `catalog.py`'s; this module ties them to
the worker's soft state (Bloom filters, cached states), the state and timer reads and the
pending productions.

Round trips per shard and batch are constant: acquire (1, plus 1 to sync soft state when another
worker committed the shard), dedup (1, only for Bloom "maybe" answers), state and timers (1),
commit (3: WATCH, check, EXEC), whatever the number of records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

from millstream.records import Production, TimeDomain, Timer
from millstream.state import _codec
from millstream.state.bloom import BucketedBloom
from millstream.state.catalog import Catalog, DedupStats, Verdict
from millstream.state.catalog_entries import unpack_log
from millstream.state.client import RedisClient, RedisPipeline
from millstream.state.keys import ShardKeys
from millstream.state.lease import Lease, Position, acquire_and_read
from millstream.state.offset_marks import OffsetMarks, Run
from millstream.state.timers import parse_timer
from millstream.state.transaction import COMMIT_LOG_KEEP, ShardTransaction
from millstream.state.watermarks import NO_WORK, Watermark
from millstream.state.wire import decode_production

STATE_CACHE_LIMIT = 100_000  # cached per-key states per shard before the cache is cleared


@dataclass(frozen=True)
class ShardConfig:
    bucket_ms: int = 600_000
    bloom_expected: int = 200_000
    bloom_fp_rate: float = 0.001
    use_bloom: bool = True


@dataclass
class ShardSoftState:
    """What a worker process remembers of a shard between batches; valid only at `version`."""

    version: int
    bloom: BucketedBloom | None
    states: dict[str, bytes | None] = field(default_factory=dict)
    rebuilds: int = 0
    synced_commits: int = 0
    synced_ids: int = 0


class SoftStateCache:
    """Per-process soft state of shards (MillWheel 8.3's framework-level cache)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shards: dict[ShardKeys, ShardSoftState] = {}

    def get(self, keys: ShardKeys) -> ShardSoftState | None:
        with self._lock:
            return self._shards.get(keys)

    def put(self, keys: ShardKeys, soft: ShardSoftState) -> None:
        with self._lock:
            self._shards[keys] = soft

    def drop(self, keys: ShardKeys) -> None:
        with self._lock:
            self._shards.pop(keys, None)

    def drop_app(self, app: str) -> None:
        """Forget every shard of `app` (stopped here: its Bloom filters and cached states would
        stay for nothing; a later run rebuilds them from Redis)."""
        with self._lock:
            for keys in [k for k in self._shards if k.app == app]:
                del self._shards[keys]


PROCESS_CACHE = SoftStateCache()


class ShardStore:
    """Used by the one task that owns a shard for one batch."""

    def __init__(
        self,
        client: RedisClient,
        keys: ShardKeys,
        config: ShardConfig | None = None,
        cache: SoftStateCache | None = PROCESS_CACHE,
    ) -> None:
        self.client = client
        self.keys = keys
        self.config = config or ShardConfig()
        self._cache = cache or SoftStateCache()
        self.lease: Lease | None = None
        self.soft: ShardSoftState | None = None
        self._version = 0
        self._next_seq = 0
        self._pending_count = 0
        self.catalog = Catalog(client, keys, self.config.bucket_ms)
        self.offset_marks = OffsetMarks()
        self._round_trips = 0

    @property
    def round_trips(self) -> int:
        """Redis round trips of this owner so far, the catalog's included."""
        return self._round_trips + self.catalog.round_trips

    @property
    def dedup_stats(self) -> DedupStats:
        return self.catalog.stats

    # --- 1. acquire ---------------------------------------------------------------------------
    def acquire(self) -> Lease:
        """Take the shard (fencing older owners) and make this process's soft state current."""
        keys = self.keys

        def reads(pipe: RedisPipeline) -> None:
            pipe.get(keys.version)
            pipe.get(keys.production_seq)
            self.catalog.queue_live_buckets(pipe)
            pipe.zcard(keys.production_times)
            pipe.hgetall(keys.offset_marks)

        self.lease, replies = acquire_and_read(self.client, keys, reads)
        version, seq, buckets, pending, marks = replies
        self.offset_marks = OffsetMarks.parse(marks)
        self._round_trips += 1
        self._version = int(version or 0)
        self._next_seq = int(seq or 0)
        self.catalog.set_live_buckets(buckets)
        self._pending_count = int(pending)
        self.soft = self._sync(self._cache.get(self.keys))
        if self.soft.bloom is not None:
            self.catalog.prune(self.soft.bloom)
        self._cache.put(self.keys, self.soft)
        return self.lease

    def _new_bloom(self) -> BucketedBloom | None:
        if not self.config.use_bloom:
            return None
        # The catalog's fingerprints are hashes already: the filters read their probes from them.
        return BucketedBloom(self.config.bloom_expected, self.config.bloom_fp_rate, hashed=True)

    def _sync(self, soft: ShardSoftState | None) -> ShardSoftState:
        if soft is not None and soft.version == self._version:
            return soft
        if soft is not None and 0 < self._version - soft.version <= COMMIT_LOG_KEEP:
            versions = [str(v) for v in range(soft.version + 1, self._version + 1)]
            entries = cast(list[bytes | None], self.client.hmget(self.keys.commit_log, versions))
            self._round_trips += 1
            logged = [None if e is None else _codec.unpack(e) for e in entries]
            # An older version's entry holds ids, not fingerprints: rebuild from the catalog.
            prints = [None if e is None else unpack_log(e[0]) for e in logged]
            if all(p is not None for p in prints):
                for parts, bucketed in zip(logged, prints, strict=True):
                    assert parts is not None and bucketed is not None
                    if soft.bloom is not None:
                        soft.bloom.add(bucketed)
                    for key in _codec.unpack(parts[1]):
                        soft.states.pop(key.decode(), None)
                    soft.synced_ids += len(bucketed)
                soft.synced_commits += len(entries)
                soft.version = self._version
                return soft
        return self._rebuild(soft)

    def _rebuild(self, old: ShardSoftState | None) -> ShardSoftState:
        """Read the whole live catalog: after a process start, or when the log was trimmed."""
        soft = ShardSoftState(version=self._version, bloom=self._new_bloom())
        soft.rebuilds = (old.rebuilds if old else 0) + 1
        if soft.bloom is not None:
            self.catalog.load(soft.bloom)
        return soft

    def _require_lease(self) -> tuple[Lease, ShardSoftState]:
        if self.lease is None or self.soft is None:
            raise RuntimeError("acquire() the shard first")
        return self.lease, self.soft

    # --- 2. dedup -----------------------------------------------------------------------------
    def bucket_of(self, system_time: int) -> int:
        return self.catalog.bucket_of(system_time)

    def dedup(
        self,
        records: Sequence[tuple[bytes, int, bytes]],
        gc_watermark: int,
        digests: Sequence[bytes] | None = None,
    ) -> list[Verdict]:
        """The catalog's verdicts on (id, system_time, position) triples (`Catalog.dedup`),
        with this process's Bloom filters."""
        _, soft = self._require_lease()
        return self.catalog.dedup(records, gc_watermark, soft.bloom, digests)

    def dedup_by_offset(self, runs: Sequence[Run], gc_watermark: int) -> list[Verdict | None]:
        """Verdicts on runs of records whose ids are their Kafka position (one run per
        partition, in offset order), from the shard's offset marks (`offset_marks.py`), no
        catalog read; flat, in the runs' order. None where no live mark covers a record (ask
        the catalog). Remnants (older than the GC watermark) as the catalog tells them."""
        self._require_lease()
        out: list[Verdict | None] = []
        runs_of: dict[bytes, int] = {}
        for run in runs:
            runs_of[run[0]] = runs_of.get(run[0], 0) + 1
        earlier: dict[bytes, set[int]] = {}  # a partition read as two streams: first one wins
        stats = self.catalog.stats
        new, replay = Verdict.NEW, Verdict.REPLAY
        for run in runs:
            prefix, offsets, _, times = run
            applied = self.offset_marks.applied(run, gc_watermark)
            if applied is None:
                out.extend([None] * len(offsets))
                continue
            verdicts = [None if a is None else replay if a else new for a in applied]
            if min(times) < gc_watermark:
                for at, system_time in enumerate(times):
                    if system_time < gc_watermark:
                        verdicts[at] = Verdict.REMNANT
            if runs_of[prefix] > 1:
                seen = earlier.setdefault(prefix, set())
                for at, offset in enumerate(offsets):
                    if verdicts[at] is new and offset in seen:
                        verdicts[at] = replay
                seen.update(offsets)
            decided = len(verdicts) - verdicts.count(None)
            stats.checked += decided
            stats.by_offset += decided
            stats.replays += verdicts.count(replay)
            stats.remnants += verdicts.count(Verdict.REMNANT)
            out.extend(verdicts)
        return out

    # --- 3. state, timers, pending productions --------------------------------------------
    def load(
        self, keys: Iterable[str], event_watermark: int, now: int
    ) -> tuple[dict[str, bytes | None], list[Timer]]:
        """States of `keys` (cached where current) and timers due at the watermark and clock."""
        _, soft = self._require_lease()
        wanted = [k for k in dict.fromkeys(keys) if k not in soft.states]
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(self.keys.timers("event"), "-inf", event_watermark, withscores=True)
        pipe.zrangebyscore(self.keys.timers("wall"), "-inf", now, withscores=True)
        # A hold is never after its timer's time: every due event timer's hold is in range.
        pipe.zrangebyscore(self.keys.timer_holds, "-inf", event_watermark, withscores=True)
        if wanted:
            pipe.hmget(self.keys.state, wanted)
        results = pipe.execute()
        self._round_trips += 1
        holds = dict(results[2])
        timers = [parse_timer(m, s, TimeDomain.EVENT, holds.get(m)) for m, s in results[0]]
        timers += [parse_timer(m, s, TimeDomain.WALL) for m, s in results[1]]
        if wanted:
            if len(soft.states) + len(wanted) > STATE_CACHE_LIMIT:
                soft.states.clear()
            soft.states.update(zip(wanted, results[3], strict=True))
        timer_keys = [t.key for t in timers if t.key not in soft.states]
        if timer_keys:
            values = cast(list[bytes | None], self.client.hmget(self.keys.state, timer_keys))
            self._round_trips += 1
            soft.states.update(zip(timer_keys, values, strict=True))
        return soft.states, timers

    def pending_productions(self) -> list[Production]:
        """Checkpointed productions not yet acknowledged (a crashed owner's, re-delivered now).
        Their hold (read at acquire) is there exactly while some are."""
        if not self._pending_count:
            return []
        raw = cast(list[bytes], self.client.hvals(self.keys.productions))
        self._round_trips += 1
        return sorted((decode_production(b) for b in raw), key=lambda p: p.seq)

    def gc_buckets(self, gc_watermark: int) -> list[int]:
        """Live catalog buckets wholly older than the GC watermark (`Catalog.gc_buckets`)."""
        return self.catalog.gc_buckets(gc_watermark)

    # --- 4. commit ----------------------------------------------------------------------------
    def position(self) -> Position:
        """This owner's lease token, version and next production seq: enough for another process
        to commit the acknowledgement of this owner's deliveries under its lease (`acknowledge`)."""
        lease, _ = self._require_lease()
        return lease.token, self._version, self._next_seq

    def begin(self, batch_id: int | None = None) -> ShardTransaction:
        """A transaction under this owner's lease; `batch_id`: the micro-batch whose effects it
        commits (recorded with them, see `last_committed_batch`)."""
        lease, _ = self._require_lease()
        return ShardTransaction(self.client, lease, self._version, self._next_seq, batch_id)

    def last_committed_batch(self) -> int | None:
        """The micro-batch of the shard's last committed effects, None if never recorded."""
        raw = self.client.get(self.keys.last_batch)
        self._round_trips += 1
        return None if raw is None else int(raw)

    def commit(self, txn: ShardTransaction) -> int:
        """Commit and bring soft state forward to the new version; on failure forget it."""
        _, soft = self._require_lease()
        try:
            version = txn.commit()
        except BaseException:
            self._cache.drop(self.keys)
            raise
        finally:
            self._round_trips += 3
        if soft.bloom is not None:
            soft.bloom.add(txn.added_ids)
        for key, value in txn.written_states.items():
            soft.states[key] = value
        soft.version = version
        self._version = version
        self._next_seq = txn._next_seq
        return version


def oldest_work(client: RedisClient, keys_list: Sequence[ShardKeys]) -> list[Watermark]:
    """Each shard's oldest work: its earliest event-time timer or watermark hold, and its oldest
    pending production.

    Derived from data only lease-guarded commits write, so a stale owner cannot move it.
    """
    pipe = client.pipeline(transaction=False)
    for keys in keys_list:
        pipe.zrange(keys.timers("event"), 0, 0, withscores=True)
        pipe.zrange(keys.timer_holds, 0, 0, withscores=True)
        pipe.zrange(keys.production_times, 0, 0, withscores=True)
        pipe.zrange(keys.production_system_times, 0, 0, withscores=True)
    results = pipe.execute()
    out: list[Watermark] = []
    for i in range(len(keys_list)):
        timer, hold, prod, prod_sys = results[4 * i : 4 * i + 4]
        events = [int(s) for _, s in [*timer, *hold, *prod]]
        systems = [int(s) for _, s in prod_sys]
        out.append(
            Watermark(min(events, default=NO_WORK.event), min(systems, default=NO_WORK.system))
        )
    return out


def acknowledge(
    client: RedisClient,
    keys: ShardKeys,
    position: Position,
    delivered: Sequence[Production],
    counters: dict[str, int],
    pending: Sequence[Production],
) -> int:
    """Delete delivered checkpoints under the lease of the owner that reported `position`.

    Used by the driver, which delivers what a shard task committed: the same guarded commit a
    task's own acknowledgement is, so a newer owner (a speculative copy, a zombie's re-run)
    makes it raise FencedError and the checkpoints stay for that owner to deliver again.
    `pending`: every checkpoint of the shard that owner left pending (`ShardTransaction.ack`).
    """
    token, version, next_seq = position
    txn = ShardTransaction(client, Lease(keys, token), version, next_seq)
    txn.ack(list(delivered), list(pending))
    for name, amount in counters.items():
        txn.count(name, amount)
    return txn.commit()
