"""Moving a computation's keys to another shard count (MillWheel section 7.1), exactly-once.

A shard is the keys whose hash is its number modulo the count, so going from S to S' shards a
key moves from shard h mod S to shard h mod S', and new shard t takes keys only from the old
shards s with s = t modulo gcd(S, S') (a split when S' is a multiple of S, a merge when S is
one of S'). The move from layout (S, g) to (S', g + 1), by the application's driver between
two batches or by `millstream rescale` while the application is stopped:

1. *Retire* the old shards: each sequencer becomes the word "retired", so no owner of the old
   layout commits again (a zombie's EXEC fails its WATCH; its next acquire fails to INCR).
   Pending productions are not moved: the Kafka sink keeps its progress per shard number, so a
   production delivered but not yet acknowledged could be delivered twice under a new number.
   Old shards with any wait (`MoveWaits`): they deliver them under the old layout first. If a
   zombie checkpointed one between the check and the retirement, the shards are reopened under
   a fresh token, newer than any earlier one.
2. *Read* each old shard whole: states, timers and holds, catalog, counters, production seq,
   last batch.
3. *Write* each new shard in one MULTI under its own lease, after deleting what an interrupted
   attempt left there: the states and timers of its keys; the union of the catalogs of every
   old shard its keys can come from (a catalog entry does not name its key, so each new shard
   gets every id it may be sent again: a split copies, a merge unites); the old shards' offset
   marks, each qualified by the keys it covers (`offset_marks.inherit`); the counters of the old
   shards s with s mod S' = t; a production seq above every old shard's (the sinks' progress is
   per shard number); the newest last batch.
4. *Switch* the recorded layout to (S', g + 1), only if it is still (S, g), and drop the request.
5. *Clean*: delete the old shards' keys; their retired sequencers stay, as tombstones.

A crash before step 4 leaves the old layout recorded with its data whole: the next attempt
starts again at step 1 and overwrites what the last one wrote. A crash after it leaves old keys,
which the next `clean_retired` deletes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from redis.typing import EncodableT, FieldT

from millstream.errors import MillstreamError
from millstream.state import catalog_entries as ce
from millstream.state.catalog import MOVE_AT, bucket_keys
from millstream.state.client import RedisClient, RedisPipeline
from millstream.state.keys import ShardKeys, shard_of
from millstream.state.lease import RETIRED, acquire, guarded
from millstream.state.offset_marks import inherit
from millstream.state.shard_count import (
    ShardLayout,
    rescale_reports_key,
    rescale_requests_key,
    retired_layouts_key,
    shard_counts_key,
)
from millstream.state.timers import timer_key

log = logging.getLogger(__name__)

DOMAINS = ("event", "wall")

# Switch the layout only if it is still the one moved from. KEYS[1] layouts, [2] requests,
# [3] retired layouts; ARGV[1] computation, [2] old layout, [3] new layout.
SWITCH_SCRIPT = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""


class MoveWaits(MillstreamError):
    """The old shards still hold productions to deliver: the move is tried again later."""


@dataclass
class MoveReport:
    computation: str
    old: str
    new: str
    keys: int = 0
    timers: int = 0
    catalog_entries: int = 0
    catalog_bytes_written: int = 0
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class _OldShard:
    states: dict[str, bytes]
    timers: dict[str, list[tuple[str, float]]]  # domain or "hold" -> (member, score)
    catalog: dict[tuple[int, int], bytes]  # (bucket, group) -> packed entries
    legacy: dict[int, dict[FieldT, EncodableT]]  # bucket -> id -> position (older versions' layout)
    buckets: dict[str, float]  # live-bucket index member -> bucket
    marks: dict[bytes, bytes]  # offset marks (offset_marks.py)
    counters: dict[bytes, bytes]
    production_seq: int
    last_batch: int | None
    pending: int


def new_shard_sources(old: int, new: int, target: int) -> list[int]:
    """The old shards whose keys can move to new shard `target`."""
    step = math.gcd(old, new)
    return list(range(target % step, old, step))


def move(
    client: RedisClient,
    app: str,
    computation: str,
    old: ShardLayout,
    shards: int,
    fault: Callable[[str], None] = lambda name: None,
) -> ShardLayout:
    """Steps 1-5 above; returns the new layout. `fault` marks each step (tests kill there)."""
    started = time.monotonic()
    new = ShardLayout(shards, old.generation + 1)
    olds = old.keys(app, computation)
    _check_nothing_pending(client, olds)
    _retire(client, olds)
    fault("rescale_after_retire")
    shards_read = [_read(client, keys) for keys in olds]
    waiting = sum(s.pending for s in shards_read)
    if waiting:
        _reopen(client, olds)
        raise MoveWaits(f"{waiting} productions were checkpointed while the move began")
    report = MoveReport(computation, old.encode(), new.encode())
    for target, keys in enumerate(new.keys(app, computation)):
        _write(client, keys, old, new, target, shards_read, report)
        fault("rescale_after_shard_written")
    switched = client.eval(
        SWITCH_SCRIPT, 3, shard_counts_key(app), rescale_requests_key(app),
        retired_layouts_key(app), computation, old.encode(), new.encode(),
    )  # fmt: skip
    if not switched:
        raise MillstreamError(
            f"rescale of {computation!r}: its recorded layout is no longer {old.describe()}; "
            "another rescale ran at the same time"
        )
    fault("rescale_after_switch")
    report.seconds = round(time.monotonic() - started, 3)
    client.hset(rescale_reports_key(app), computation, report.to_json())
    clean_retired(client, app, computation)
    log.info(
        "rescaled %s of %s from %s to %s: %d keys, %d timers, %d catalog entries in %.2f s",
        computation, app, old.describe(), new.describe(), report.keys, report.timers,
        report.catalog_entries, report.seconds,
    )  # fmt: skip
    return new


def clean_retired(client: RedisClient, app: str, computation: str) -> None:
    """Step 5: delete the keys of the layout the last rescale retired, if any are left."""
    raw = client.hget(retired_layouts_key(app), computation)
    if raw is None:
        return
    for keys in ShardLayout.decode(raw).keys(app, computation):
        buckets: list[Any] = client.zrange(keys.buckets, 0, -1, withscores=True)
        doomed = [*_fixed_keys(keys), *_catalog_keys(keys, {int(s) for _, s in buckets})]
        client.delete(*doomed)
    client.hdel(retired_layouts_key(app), computation)


def _check_nothing_pending(client: RedisClient, olds: list[ShardKeys]) -> None:
    pipe = client.pipeline(transaction=False)
    for keys in olds:
        pipe.hlen(keys.productions)
    pending = {k.shard: int(n) for k, n in zip(olds, pipe.execute(), strict=True) if int(n)}
    if pending:
        raise MoveWaits(
            f"shards {sorted(pending)} hold {sum(pending.values())} productions not yet "
            "delivered; they are delivered under the current layout first"
        )


def _retire(client: RedisClient, olds: list[ShardKeys]) -> None:
    pipe = client.pipeline(transaction=False)
    for keys in olds:
        pipe.set(keys.sequencer, RETIRED)
    pipe.execute()


def _reopen(client: RedisClient, olds: list[ShardKeys]) -> None:
    """Undo `_retire` with a token newer than any owner's so far (tokens are INCR counts)."""
    fresh = time.time_ns() // 1000
    pipe = client.pipeline(transaction=False)
    for keys in olds:
        pipe.set(keys.sequencer, fresh)
    pipe.execute()


def _read(client: RedisClient, keys: ShardKeys) -> _OldShard:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.state)
    for domain in DOMAINS:
        pipe.zrange(keys.timers(domain), 0, -1, withscores=True)
    pipe.zrange(keys.timer_holds, 0, -1, withscores=True)
    pipe.zrange(keys.buckets, 0, -1, withscores=True)
    pipe.hgetall(keys.counters)
    pipe.get(keys.production_seq)
    pipe.get(keys.last_batch)
    pipe.hlen(keys.productions)
    pipe.hgetall(keys.offset_marks)
    states, event, wall, holds, buckets, counters, seq, last, pending, marks = pipe.execute()
    index = {_text(m): float(s) for m, s in buckets}
    live = sorted({int(s) for s in index.values()})
    pipe = client.pipeline(transaction=False)
    for bucket in live:
        pipe.hgetall(keys.catalog_groups(bucket))
        for group in range(ce.GROUPS):
            pipe.get(keys.catalog_group(bucket, group))
        pipe.hgetall(keys.catalog(bucket))
    replies: list[Any] = pipe.execute() if live else []
    catalog: dict[tuple[int, int], bytes] = {}
    legacy: dict[int, dict[FieldT, EncodableT]] = {}
    step = ce.GROUPS + 2
    for at, bucket in enumerate(live):
        small, *strings, old_hash = replies[at * step : (at + 1) * step]
        for group, blob in small.items():
            catalog[(bucket, int(group))] = blob
        for group, blob in enumerate(strings):
            if blob:
                catalog[(bucket, group)] = catalog.get((bucket, group), b"") + blob
        if old_hash:
            legacy[bucket] = old_hash
    return _OldShard(
        states={_text(k): v for k, v in states.items()},
        timers={
            "event": [(_text(m), s) for m, s in event],
            "wall": [(_text(m), s) for m, s in wall],
            "hold": [(_text(m), s) for m, s in holds],
        },
        catalog=catalog,
        legacy=legacy,
        buckets=index,
        marks=marks,
        counters=counters,
        production_seq=int(seq or 0),
        last_batch=None if last is None else int(last),
        pending=int(pending),
    )


def _write(
    client: RedisClient,
    keys: ShardKeys,
    old: ShardLayout,
    new: ShardLayout,
    target: int,
    shards_read: list[_OldShard],
    report: MoveReport,
) -> None:
    """Step 3 for new shard `target`: one MULTI under its lease."""
    numbers = new_shard_sources(old.shards, new.shards, target)
    sources = [shards_read[s] for s in numbers]
    marks = inherit([(s, shards_read[s].marks) for s in numbers], old.shards)

    def mine(key: str) -> bool:
        return shard_of(key, new.shards) == target

    states: dict[FieldT, EncodableT] = {
        k: v for s in sources for k, v in s.states.items() if mine(k)
    }
    timers: dict[str, dict[str, EncodableT]] = defaultdict(dict)
    for source in sources:
        for name, members in source.timers.items():
            for member, score in members:
                if mine(timer_key(member)):
                    timers[name][member] = score
    catalog: dict[tuple[int, int], bytes] = defaultdict(bytes)
    legacy: dict[int, dict[FieldT, EncodableT]] = defaultdict(dict)
    index: dict[str, EncodableT] = {}
    for source in sources:
        for where, blob in source.catalog.items():
            catalog[where] += blob
        for bucket, ids in source.legacy.items():
            legacy[bucket].update(ids)
        index.update(source.buckets)
    counters: dict[FieldT, EncodableT] = defaultdict(int)
    for number, source in enumerate(shards_read):
        if number % new.shards == target:
            for counter, value in source.counters.items():
                counters[counter] = int(counters.get(counter, 0)) + int(value)
    seq = max(s.production_seq for s in shards_read)
    last = max((s.last_batch for s in shards_read if s.last_batch is not None), default=None)
    # Another owner taking the new shard meanwhile makes this FencedError (`guarded`).
    with guarded(client, acquire(client, keys)) as pipe:
        buckets = {int(float(b)) for b in index.values()}
        pipe.delete(*_fixed_keys(keys), *_catalog_keys(keys, buckets))
        if states:
            pipe.hset(keys.state, mapping=states)
        for kind, scored in timers.items():
            key = keys.timer_holds if kind == "hold" else keys.timers(kind)
            pipe.zadd(key, scored)
        _queue_catalog(pipe, keys, catalog, legacy, index)
        if marks:
            pipe.hset(keys.offset_marks, mapping=dict(marks.items()))
        if counters:
            pipe.hset(keys.counters, mapping=counters)
        pipe.set(keys.production_seq, seq)
        if last is not None:
            pipe.set(keys.last_batch, last)
        pipe.set(keys.version, 1)  # no commit log: a worker rebuilds its soft state
        pipe.execute()
    report.keys += len(states)
    report.timers += len(timers.get("event", {})) + len(timers.get("wall", {}))
    report.catalog_entries += sum(len(b) for b in catalog.values()) // ce.ENTRY_BYTES
    report.catalog_bytes_written += sum(len(b) for b in catalog.values())


def _queue_catalog(
    pipe: RedisPipeline,
    keys: ShardKeys,
    catalog: dict[tuple[int, int], bytes],
    legacy: dict[int, dict[FieldT, EncodableT]],
    index: dict[str, EncodableT],
) -> None:
    """The catalog as `catalog.queue_writes` would have left it: small groups in the bucket's
    hash, large ones in their own strings; an older version's hashes as they were."""
    for (bucket, group), blob in catalog.items():
        if len(blob) < MOVE_AT:
            pipe.hset(keys.catalog_groups(bucket), str(group), blob)
        else:
            pipe.set(keys.catalog_group(bucket, group), blob)
    for bucket, ids in legacy.items():
        pipe.hset(keys.catalog(bucket), mapping=ids)
    if index:
        pipe.zadd(keys.buckets, index)


def _fixed_keys(keys: ShardKeys) -> list[str]:
    """Every key of a shard but its sequencer and catalog buckets."""
    return [
        keys.state, *[keys.timers(d) for d in DOMAINS], keys.timer_holds, keys.version,
        keys.production_seq, keys.last_batch, keys.counters, keys.buckets, keys.productions,
        keys.production_times, keys.production_system_times, keys.commit_log, keys.offset_marks,
    ]  # fmt: skip


def _catalog_keys(keys: ShardKeys, buckets: set[int]) -> list[str]:
    return [k for b in sorted(buckets) for k in bucket_keys(keys, b)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def last_report(client: RedisClient, app: str, computation: str) -> dict[str, Any] | None:
    """The last rescale's report (`MoveReport`), for `millstream rescale` and status."""
    raw = client.hget(rescale_reports_key(app), computation)
    return None if raw is None else dict(json.loads(raw))
