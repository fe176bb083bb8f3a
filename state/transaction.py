"""One atomic, lease-guarded commit of everything a shard's batch did."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

import redis
from redis.typing import EncodableT, FieldT

from millstream.errors import FencedError, TransientError
from millstream.records import Production, TimeDomain
from millstream.state import _codec, catalog_entries
from millstream.state.catalog import queue_writes as queue_catalog_writes
from millstream.state.client import RedisClient, RedisPipeline
from millstream.state.keys import ShardKeys
from millstream.state.lease import Lease, guarded
from millstream.state.timers import timer_member
from millstream.state.wire import encode_production

log = logging.getLogger(__name__)

COMMIT_LOG_KEEP = 256  # commits kept in the shard's log for cheap soft-state sync


class TransactionStatus(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    FENCED = "fenced"
    FAILED = "failed"


@dataclass
class _Effects:
    states: dict[str, bytes | None] = field(default_factory=dict)
    # (key, tag) -> (domain, time, hold) to set, or None to delete
    timers: dict[tuple[str, str], tuple[TimeDomain, int, int | None] | None] = field(
        default_factory=dict
    )
    ids: list[catalog_entries.Entry] = field(default_factory=list)
    productions: list[Production] = field(default_factory=list)
    acked: list[Production] = field(default_factory=list)
    # Every checkpoint of the shard pending before this commit (`ShardTransaction.ack`).
    pending: list[Production] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    drop_buckets: list[int] = field(default_factory=list)
    marks: dict[bytes, bytes] = field(default_factory=dict)
    dropped_marks: list[bytes] = field(default_factory=list)


class ShardTransaction:
    """Buffers a shard's effects and commits them in one MULTI/EXEC guarded by the lease.

    Created by `ShardStore.begin`; valid until `commit()`. A write after commit, or a second
    commit, raises at once.
    """

    def __init__(
        self,
        client: RedisClient,
        lease: Lease,
        base_version: int,
        next_seq: int,
        batch_id: int | None = None,
    ) -> None:
        self._client = client
        self._batch_id = batch_id
        self.lease = lease
        self._base_version = base_version
        self._next_seq = next_seq
        self._fx = _Effects()
        self.status = TransactionStatus.OPEN
        self.version: int | None = None

    # --- buffering ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.status is not TransactionStatus.OPEN:
            raise RuntimeError(f"shard transaction is {self.status.value}: no more writes")

    def set_state(self, key: str, value: bytes) -> None:
        self._check_open()
        self._fx.states[key] = value

    def delete_state(self, key: str) -> None:
        self._check_open()
        self._fx.states[key] = None

    def set_timer(
        self, key: str, tag: str, time: int, domain: TimeDomain, hold: int | None = None
    ) -> None:
        """A tag names one timer per key; setting it again moves it (to any domain) and
        replaces its watermark hold (event timers; persisted with the timer)."""
        self._check_open()
        if hold is not None and (domain is not TimeDomain.EVENT or hold > time):
            raise ValueError(f"timer {tag!r}: a hold needs an event timer and hold <= time")
        self._fx.timers[(key, tag)] = (domain, int(time), None if hold is None else int(hold))

    def delete_timer(self, key: str, tag: str) -> None:
        self._check_open()
        self._fx.timers[(key, tag)] = None

    def has_timer_op(self, key: str, tag: str) -> bool:
        return (key, tag) in self._fx.timers

    def timer_op(self, key: str, tag: str) -> tuple[TimeDomain, int, int | None] | None:
        """The buffered (domain, time, hold) of a timer set in this transaction, None if
        deleted."""
        return self._fx.timers[(key, tag)]

    def set_timers(self) -> list[tuple[str, str, TimeDomain, int, int | None]]:
        """Timers set (not deleted) in this transaction: (key, tag, domain, time, hold)."""
        return [(k, t, *op) for (k, t), op in self._fx.timers.items() if op is not None]

    def add_ids(self, bucketed: list[tuple[int, bytes, bytes]]) -> None:
        """(bucket, id, position) entering the catalog with this commit: a redelivery of the
        id is then a duplicate (another position) or a replay (the same position)."""
        self._check_open()
        self._fx.ids.extend(catalog_entries.entries(bucketed))

    def add_digests(self, bucketed: list[tuple[int, bytes, bytes]]) -> None:
        """`add_ids` for ids the dedup already hashed: (bucket, `catalog_entries.digest` of
        the id, position)."""
        self._check_open()
        self._fx.ids.extend(catalog_entries.entries_of_digests(bucketed))

    def move_offset_marks(self, sets: dict[bytes, bytes], drops: list[bytes]) -> None:
        """The shard's offset marks this commit moves and drops (`OffsetMarks.writes`): the
        records whose ids are their position enter the shard's memory this way, not the
        catalog's, in the same commit as their effects."""
        self._check_open()
        self._fx.marks.update(sets)
        self._fx.dropped_marks.extend(drops)

    def checkpoint(self, production: Production) -> Production:
        """Strong production: stored with this commit, delivered after it, deleted after the ack."""
        self._check_open()
        stamped = Production(
            production.stream,
            production.key,
            production.value,
            production.timestamp,
            production.id,
            production.system_time,
            self._next_seq,
            production.headers,
        )
        self._next_seq += 1
        self._fx.productions.append(stamped)
        return stamped

    def ack(self, productions: list[Production], pending: list[Production]) -> None:
        """Delete checkpoints whose delivery was acknowledged. `pending`: every checkpoint of
        the shard pending until now (the owner read them all at acquire, or committed them
        under its lease): the shard's watermark holds are set afresh from those that stay."""
        self._check_open()
        self._fx.acked.extend(productions)
        self._fx.pending.extend(pending)

    def count(self, name: str, amount: int = 1) -> None:
        self._check_open()
        if amount:
            self._fx.counters[name] = self._fx.counters.get(name, 0) + amount

    def drop_buckets(self, buckets: list[int]) -> None:
        """Garbage-collect whole catalog buckets that the GC watermark has passed."""
        self._check_open()
        self._fx.drop_buckets.extend(buckets)

    @property
    def productions(self) -> list[Production]:
        return list(self._fx.productions)

    @property
    def written_states(self) -> dict[str, bytes | None]:
        return dict(self._fx.states)

    @property
    def added_ids(self) -> list[tuple[int, bytes]]:
        """(bucket, fingerprint) of the ids this commit adds: what the Bloom filters take."""
        return [(e[0], e[1]) for e in self._fx.ids]  # catalog_entries.BUCKET, FINGERPRINT

    def is_empty(self) -> bool:
        fx = self._fx
        return not (
            fx.states
            or fx.timers
            or fx.ids
            or fx.productions
            or fx.acked
            or fx.counters
            or fx.drop_buckets
            or fx.marks
            or fx.dropped_marks
        )

    # --- commit -------------------------------------------------------------------------------
    def commit(self) -> int:
        """Apply every buffered effect atomically, or nothing; returns the shard's new version.

        1. WATCH the shard's sequencer and check it still holds this lease's token; a newer
           token means a newer owner: raise FencedError (never retried). Steps 1 and 3 are
           `lease.guarded`.
        2. MULTI: state writes and deletes, timer sets and deletes, catalog ids per bucket and
           the live-bucket index, offset marks, checkpointed productions with their seq,
           acknowledged checkpoints removed, the productions' watermark holds, dropped buckets,
           metrics, the commit-log entry and version.
        3. EXEC: if the sequencer moved in between, Redis discards it all: FencedError.
        """
        self._check_open()
        keys = self.lease.keys
        version = self._base_version + 1
        try:
            with guarded(self._client, self.lease) as pipe:
                self._queue(pipe, version)
                pipe.execute()
        except FencedError:
            self.status = TransactionStatus.FENCED
            raise
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.status = TransactionStatus.FAILED
            raise TransientError(f"Redis unavailable while committing {keys.tag}: {exc}") from exc
        except BaseException:
            self.status = TransactionStatus.FAILED
            raise
        self.status = TransactionStatus.COMMITTED
        self.version = version
        return version

    def _queue(self, pipe: RedisPipeline, version: int) -> None:
        keys = self.lease.keys
        fx = self._fx
        sets: dict[FieldT, EncodableT] = {k: v for k, v in fx.states.items() if v is not None}
        deletes = [k for k, v in fx.states.items() if v is None]
        if sets:
            pipe.hset(keys.state, mapping=sets)
        if deletes:
            pipe.hdel(keys.state, *deletes)
        _queue_timers(pipe, keys, fx.timers)
        queue_catalog_writes(pipe, keys, fx.ids, fx.drop_buckets)
        if fx.marks:
            marks: dict[FieldT, EncodableT] = dict(fx.marks.items())
            pipe.hset(keys.offset_marks, mapping=marks)
        if fx.dropped_marks:
            pipe.hdel(keys.offset_marks, *fx.dropped_marks)
        if fx.productions:
            checkpoints: dict[FieldT, EncodableT] = {
                p.id: encode_production(p) for p in fx.productions
            }
            pipe.hset(keys.productions, mapping=checkpoints)
            pipe.set(keys.production_seq, self._next_seq)
        if fx.acked:
            pipe.hdel(keys.productions, *[p.id for p in fx.acked])
        _queue_production_holds(pipe, keys, fx.productions, fx.acked, fx.pending)
        for name, amount in fx.counters.items():
            pipe.hincrby(keys.counters, name, amount)
        entry = _codec.pack(
            [
                catalog_entries.pack_log(fx.ids),
                _codec.pack([k.encode() for k in fx.states]),
            ]
        )
        pipe.hset(keys.commit_log, str(version), entry)
        if version > COMMIT_LOG_KEEP:
            pipe.hdel(keys.commit_log, str(version - COMMIT_LOG_KEEP))
        pipe.set(keys.version, version)
        if self._batch_id is not None:
            pipe.set(keys.last_batch, self._batch_id)


HOLD = b"hold"  # the one member of a shard's production hold sets (`_queue_production_holds`)


def _queue_production_holds(
    pipe: RedisPipeline,
    keys: ShardKeys,
    checkpointed: list[Production],
    acked: list[Production],
    pending: list[Production],
) -> None:
    """The shard's pending checkpoints hold its low watermark at their earliest event time
    and the catalog GC of their consumers at their earliest system time (`oldest_work`). Each
    hold is one sorted-set member (`HOLD`) scored with that minimum, not one member per
    production: a checkpoint moves it down (ZADD LT), an acknowledgement sets it afresh from
    the checkpoints left (`pending` less `acked`, with any checkpointed in the same commit),
    or deletes it when none are. Two members a production, added and then removed, cost the
    commit and its acknowledgement a third of their Redis arguments. A shard written by an
    older version holds one member per production; an acknowledgement replaces them (DEL) with
    the one."""
    if acked:
        done = {p.id for p in acked}
        left = [*(p for p in pending if p.id not in done), *checkpointed]
        pipe.delete(keys.production_times, keys.production_system_times)
    elif checkpointed:
        left = checkpointed
    else:
        return
    if left:
        pipe.zadd(keys.production_times, {HOLD: min(p.timestamp for p in left)}, lt=True)
        pipe.zadd(keys.production_system_times, {HOLD: min(p.system_time for p in left)}, lt=True)


def _queue_timers(
    pipe: RedisPipeline,
    keys: ShardKeys,
    ops: dict[tuple[str, str], tuple[TimeDomain, int, int | None] | None],
) -> None:
    """Timer sets and deletes as one ZADD and one ZREM per sorted set, whatever their number.

    A timer lives in the set of its domain only: set, it is removed from the other domain's
    set; deleted (or fired), from both. Its hold is set with it, or released. No member is both
    added to and removed from the same set, so grouping the commands keeps their meaning; one
    command per timer made a batch's commit thousands of commands long.
    """
    if not ops:
        return
    added: dict[TimeDomain, dict[str, int]] = {d: {} for d in TimeDomain}
    removed: dict[TimeDomain, list[str]] = {d: [] for d in TimeDomain}
    holds: dict[str, int] = {}
    released: list[str] = []
    for (key, tag), spec in ops.items():
        member = timer_member(key, tag)
        for domain in TimeDomain:
            if spec is None or spec[0] is not domain:
                removed[domain].append(member)
        if spec is None:
            released.append(member)
            continue
        added[spec[0]][member] = spec[1]
        if spec[2] is None:
            released.append(member)  # moved without a hold: the hold is released
        else:
            holds[member] = spec[2]
    for domain in TimeDomain:
        if removed[domain]:
            pipe.zrem(keys.timers(domain.value), *removed[domain])
        if added[domain]:
            pipe.zadd(keys.timers(domain.value), added[domain])
    if released:
        pipe.zrem(keys.timer_holds, *released)
    if holds:
        pipe.zadd(keys.timer_holds, holds)
