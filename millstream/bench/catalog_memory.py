"""Part of scenario 4 (dedup): what the record-id catalog costs in Redis per retained id.

Ids are committed through the real commit path (`ShardStore`, `ShardTransaction`) at two fills
of a shard-bucket: ~750 ids (10 ids/s per computation over 8 shards and 600 s buckets) and
~75,000 (1,000 ids/s). The cost is the `used_memory` that deleting the catalog's keys frees,
per id (the growth over the fill is reported too: at the small fill it also holds ~8-10 B/id
that stay after every key of the run is deleted, in either layout: client buffers, the
keyspace's tables). The hash layout of the previous version (a hash id -> position per
bucket) is measured on the same ids for comparison, written as it wrote them. Also timed: a commit of 1,000 ids and a dedup
look-up of 50 ids the filters say "maybe" to, at the large fill.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from millstream.state.catalog import bucket_keys
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache

TARGET_NAME = "catalog bytes per retained id"
TARGET_BYTES = 40.0
BUCKET_MS = 600_000
T0 = 1_700_000_000_000
# ids per shard-bucket, shards, buckets, ids per commit: 10 ids/s and 1,000 ids/s per computation
# over 8 shards, 600 s buckets (commits of 10 ids: a batch every 8 s at the low rate)
FILLS = ((750, 8, 4, 10), (75_000, 2, 1, 1000))


def _ids(n: int) -> list[tuple[bytes, bytes]]:
    """(id, position) pairs: 16-byte ids, positions as the injectors give (source:part:offset)."""
    return [(uuid.uuid4().bytes, f"orders:{i % 8}:{10_000_000 + i}".encode()) for i in range(n)]


def _used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _commit_packed(
    client: Any, keys: ShardKeys, cache: SoftStateCache, bucket: int, ids: Any
) -> float:
    store = ShardStore(client, keys, ShardConfig(bucket_ms=BUCKET_MS), cache)
    store.acquire()
    txn = store.begin()
    txn.add_ids([(bucket, rid, pos) for rid, pos in ids])
    started = time.perf_counter()
    store.commit(txn)
    return time.perf_counter() - started


def _commit_hash(client: Any, keys: ShardKeys, _: SoftStateCache, bucket: int, ids: Any) -> float:
    """The previous version's catalog write: HSET id -> position, ZADD of the bucket."""
    started = time.perf_counter()
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.catalog(bucket), mapping=dict(ids))
    pipe.zadd(keys.buckets, {str(bucket): bucket})
    pipe.execute()
    return time.perf_counter() - started


def _catalog_bytes(client: Any, keys: ShardKeys, bucket: int) -> int:
    """MEMORY USAGE of a bucket's catalog keys (either layout): their allocations, the free
    space APPEND leaves at the end of a string included."""
    return sum(client.memory_usage(k, samples=0) or 0 for k in bucket_keys(keys, bucket))


def _fill(
    client: Any, layout: str, per_bucket: int, shards: int, buckets: int, commit: int
) -> dict[str, Any]:
    """Fill `buckets` buckets of `shards` shards with `per_bucket` ids each, `commit` per
    commit; bytes per id by the used_memory deleting the catalog frees, by MEMORY USAGE of its
    keys and by used_memory growth over the fill. A string that APPEND grows doubles its allocation and
    the groups of a bucket grow in step, so bytes per id swing with the fill: the peak over
    the second half of the last bucket's fill (every phase of a doubling) is reported too."""
    write: Callable[..., float] = _commit_packed if layout == "packed" else _commit_hash
    app = f"benchcat{uuid.uuid4().hex[:8]}"
    all_keys = [ShardKeys(app, "c", s) for s in range(shards)]
    cache = SoftStateCache()
    before = _used(client)
    seconds: list[float] = []
    peak = 0.0
    bucket = T0 // BUCKET_MS
    for keys in all_keys:
        for b in range(buckets):
            ids = _ids(per_bucket)
            for start in range(0, per_bucket, commit):
                chunk = ids[start : start + commit]
                seconds.append(write(client, keys, cache, bucket + b, chunk))
                done = start + len(chunk)
                last = keys is all_keys[-1] and b == buckets - 1
                if last and done >= per_bucket / 2 and (done // commit) % 5 == 0:
                    peak = max(peak, _catalog_bytes(client, keys, bucket + b) / done)
    for keys in all_keys:
        client.delete(keys.commit_log)
    ids_total = per_bucket * shards * buckets
    grown = _used(client) - before
    usage = sum(
        _catalog_bytes(client, keys, bucket + b) + (client.memory_usage(keys.buckets) or 0)
        for keys in all_keys
        for b in range(buckets)
    )
    out = {
        "ids": ids_total,
        "memory_usage_bytes_per_id": round(usage / ids_total, 1),
        "used_memory_growth_bytes_per_id": round(grown / ids_total, 1),
        "peak_bytes_per_id": round(peak, 1),
        "commit_ms": round(1000 * statistics.median(seconds[-5:]), 2),
    }
    if commit >= 1000:
        look_up = _look_up if layout == "packed" else _look_up_hash
        out["lookup_50_ms"], out["lookup_round_trips"] = look_up(client, all_keys[-1], ids[:50])
    held = _used(client)
    for keys in all_keys:
        client.delete(
            keys.buckets, *[k for b in range(buckets) for k in bucket_keys(keys, bucket + b)]
        )
    out["bytes_per_id"] = round((held - _used(client)) / ids_total, 1)
    for keys in all_keys:
        for key in client.scan_iter(match=keys.tag.replace("{", "\\{").replace("}", "\\}") + "*"):
            client.delete(key)
    out["residual_bytes_per_id"] = round((_used(client) - before) / ids_total, 1)
    return out


def _look_up(client: Any, keys: ShardKeys, known: list[tuple[bytes, bytes]]) -> tuple[float, int]:
    """Median ms of a dedup of 50 retained ids (all "maybe", all read) and its round trips."""
    store = ShardStore(client, keys, ShardConfig(bucket_ms=BUCKET_MS), SoftStateCache())
    store.acquire()
    records = [(rid, T0, pos) for rid, pos in known]
    times, trips = [], 0
    for _ in range(5):
        before = store.round_trips
        started = time.perf_counter()
        store.dedup(records, 0)
        times.append(time.perf_counter() - started)
        trips = store.round_trips - before
    return round(1000 * statistics.median(times), 2), trips


def _look_up_hash(
    client: Any, keys: ShardKeys, known: list[tuple[bytes, bytes]]
) -> tuple[float, int]:
    """The previous version's look-up of 50 ids: one HMGET of the bucket."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        pipe.hmget(keys.catalog(T0 // BUCKET_MS), [rid for rid, _ in known])
        pipe.execute()
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 2), 1


def measure(client: Any) -> dict[str, Any]:
    """Bytes per retained id, commit and look-up costs, per layout and fill."""
    rows = []
    for per_bucket, shards, buckets, commit in FILLS:
        for layout in ("hash", "packed"):
            row = _fill(client, layout, per_bucket, shards, buckets, commit)
            rows.append(
                {"layout": layout, "per_shard_bucket": per_bucket, "commit_ids": commit, **row}
            )
    return {"rows": rows}


def catalog_target(
    run: Mapping[str, Any] | None,
    why_absent: str,
    entry: Callable[..., dict[str, Any]],
    absent: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """The target on the dedup scenario's figures: the packed layout's worst fill."""
    rows = (run or {}).get("catalog", {}).get("rows")
    if not rows:
        return absent(TARGET_NAME, "B/id", "<=", TARGET_BYTES, why_absent)
    packed = [r for r in rows if r["layout"] == "packed"]
    detail = "; ".join(
        f"{r['layout']} layout at {r['per_shard_bucket']} ids per shard-bucket: "
        f"{r['bytes_per_id']} B/id at the end (used_memory), peak {r['peak_bytes_per_id']} B/id "
        f"(MEMORY USAGE); commit of {r['commit_ids']} ids {r['commit_ms']} ms"
        for r in rows
    )
    worst = max(max(r["bytes_per_id"], r["peak_bytes_per_id"]) for r in packed)
    return entry(TARGET_NAME, "B/id", "<=", TARGET_BYTES, worst, None, detail + ".")
