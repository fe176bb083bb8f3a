"""Scenario 4, the cost of exactly-once dedup in the state layer (`millstream.state`).

The measurement of `benchmarks/bench_state.py` (catalog reads), over a grid: Bloom filters on
and off x 0% and 5% duplicates x several shard batch sizes. Two workers (two
`SoftStateCache`s, as two Spark Python workers) alternate on the same 4 shards batch after
batch, so every acquire syncs soft state from the other worker's commits; duplicates are ids
the other worker may have committed, sent from new positions. Every verdict is checked.
Reported at steady state (from the third batch): catalog reads per record (Redis look-ups the
Bloom filter did not avoid), empty reads per record (Bloom false positives), Redis round trips
per shard batch (acquire, dedup, load, commit: constant in the batch size) and ms per batch.
Then the catalog's memory per retained id, old and new layout (`catalog_memory.py`).
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from millstream.bench._harness import Bench, print_table, say, write_json
from millstream.bench.catalog_memory import measure as measure_catalog
from millstream.records import Production
from millstream.state.catalog import Verdict
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache

NAME = "dedup"
SHARDS = 4
KEYS_PER_RECORD = 10  # N records touch N / 10 distinct keys
PAYLOAD = b"x" * 64


@dataclass
class BatchOutcome:
    verdicts: list[Verdict]
    productions: list[Production]
    round_trips: int
    seconds: float
    catalog_reads: int
    false_positives: int


def shard_batch(
    store: ShardStore,
    ids: Sequence[bytes],
    positions: Sequence[bytes],
    system_time: int,
    previous: Sequence[Production] = (),
    produce: bool = True,
) -> BatchOutcome:
    """acquire, dedup, load, state writes, catalog ids, productions, ack of `previous`, commit."""
    started = time.perf_counter()
    store.acquire()
    verdicts = store.dedup(list(zip(ids, [system_time] * len(ids), positions, strict=True)), 0)
    fresh = [
        (rid, pos, f"k{i // KEYS_PER_RECORD}")
        for i, (rid, pos, v) in enumerate(zip(ids, positions, verdicts, strict=True))
        if v is Verdict.NEW
    ]
    states, _ = store.load([key for _, _, key in fresh], system_time, system_time)
    counts: dict[str, int] = {}
    for _, _, key in fresh:
        counts[key] = counts.get(key, int(states.get(key) or 0)) + 1
    txn = store.begin()
    for key, n in counts.items():
        txn.set_state(key, str(n).encode())
    bucket = store.bucket_of(system_time)
    txn.add_ids([(bucket, rid, pos) for rid, pos, _ in fresh])
    if produce:
        for rid, _, key in fresh:
            txn.checkpoint(Production("out", key, PAYLOAD, system_time, b"p" + rid, system_time))
    if previous:
        txn.ack(list(previous), list(previous))  # the previous batch's: all that was pending
    txn.count("records", len(fresh))
    store.commit(txn)
    stats = store.dedup_stats
    return BatchOutcome(
        verdicts,
        txn.productions,
        store.round_trips,
        time.perf_counter() - started,
        stats.catalog_reads,
        stats.false_positives,
    )


def sample(
    client: Any, dup_rate: float, use_bloom: bool, batches: int, per_batch: int, seed: int
) -> dict[str, float]:
    rng = random.Random(seed)
    config = ShardConfig(use_bloom=use_bloom)
    app = f"bench{uuid.uuid4().hex[:10]}"
    workers = [SoftStateCache(), SoftStateCache()]
    history: dict[int, list[bytes]] = {s: [] for s in range(SHARDS)}
    system_time = int(time.time() * 1000)
    reads = empty = checked = trips = 0
    seconds: list[float] = []
    for batch in range(batches):
        worker = workers[batch % 2]  # Spark does not pin shards to Python workers
        for shard in range(SHARDS):
            store = ShardStore(client, ShardKeys(app, "bench", shard), config, worker)
            n_dup = min(round(per_batch * dup_rate), len(history[shard]))
            dups = rng.sample(history[shard], n_dup)
            fresh = [uuid.uuid4().bytes for _ in range(per_batch - n_dup)]
            ids = fresh + dups
            rng.shuffle(ids)
            positions = [b"in:0:" + uuid.uuid4().hex[:12].encode() for _ in ids]
            outcome = shard_batch(store, ids, positions, system_time, produce=False)
            verdicts, took = outcome.verdicts, outcome.seconds
            dup_set = set(dups)
            for rid, verdict in zip(ids, verdicts, strict=True):
                expected = Verdict.DUPLICATE if rid in dup_set else Verdict.NEW
                if verdict is not expected:
                    raise AssertionError(
                        f"dedup verdict {verdict} for {rid.hex()}, expected {expected}"
                    )
            history[shard].extend(fresh)
            if batch >= 2:  # steady state: each worker has built its soft state once
                stats = store.dedup_stats
                reads += stats.catalog_reads
                empty += stats.false_positives
                checked += len(ids)
                trips += store.round_trips
                seconds.append(took)
    return {
        "reads_per_record": reads / checked,
        "empty_reads_per_record": empty / checked,
        "round_trips_per_batch": trips / len(seconds),
        "ms_per_batch": 1000 * statistics.median(seconds),
    }


def run(bench: Bench) -> dict[str, Any]:
    sizes = [100, 1000] if bench.quick else [100, 1000, 5000]
    reps = 1 if bench.quick else 3
    client = bench.redis()
    rows: list[dict[str, Any]] = []
    seed = 1000
    for per_batch in sizes:
        batches = 6 if bench.quick else max(6, min(14, 40_000 // per_batch))
        for dup_rate in (0.0, 0.05):
            runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for rep in range(reps):  # Bloom on and off alternate (ABBA) under the same load
                for bloom in (True, False) if rep % 2 == 0 else (False, True):
                    seed += 1
                    runs[bloom].append(sample(client, dup_rate, bloom, batches, per_batch, seed))
            for bloom in (True, False):
                merged = {
                    k: round(statistics.median(r[k] for r in runs[bloom]), 4)
                    for k in runs[bloom][0]
                }
                rows.append({"batch": per_batch, "duplicates": dup_rate, "bloom": bloom, **merged})
            say(f"{NAME}: batch {per_batch}, duplicates {dup_rate:.0%} done")
    table = print_table(
        "dedup cost per shard batch (two workers alternating on 4 shards, steady state)",
        ["batch", "dups", "bloom", "reads/rec", "empty/rec", "round trips", "ms/batch"],
        [
            [
                r["batch"],
                f"{r['duplicates']:.0%}",
                "on" if r["bloom"] else "off",
                r["reads_per_record"],
                r["empty_reads_per_record"],
                r["round_trips_per_batch"],
                r["ms_per_batch"],
            ]
            for r in rows
        ],
    )
    catalog = measure_catalog(client)
    catalog["table"] = print_table(
        "catalog memory per retained id (used_memory freed by deleting it; peak: MEMORY USAGE "
        "over the second half of a fill); commit and look-up at the fill",
        [
            "layout",
            "ids/shard-bucket",
            "B/id",
            "peak B/id",
            "commit ids",
            "commit ms",
            "look-up 50 ms",
        ],
        [
            [
                r["layout"],
                r["per_shard_bucket"],
                r["bytes_per_id"],
                r["peak_bytes_per_id"],
                r["commit_ids"],
                r["commit_ms"],
                r.get("lookup_50_ms", ""),
            ]
            for r in catalog["rows"]
        ],
    )
    result = {
        "scenario": NAME,
        "shards": SHARDS,
        "reps": reps,
        "rows": rows,
        "table": table,
        "catalog": catalog,
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
