"""State-layer costs (`millstream.state`) on a single Redis and on a 3-master Redis Cluster.

    .venv/bin/python benchmarks/bench_state.py [--redis-url URL] [--cluster-url URL]
                                               [--json out.json] [--reps 6]

Without URLs it starts a private redis-server and a local 3-master cluster (and stops them).
With a URL, keys go to a fresh `ms:{benchXXXX...}` namespace; byte counts then include any other
traffic that server carries. Every figure is a median over runs; Bloom on and off run
alternately (ABBA...) so both see the same load of a shared machine, and each off/on ratio is
the median of per-pair ratios. Wall times on a busy machine are noisy: the CPU columns (this
process, and the Redis servers from `INFO cpu`) say where the time goes.

Per deployment:

1. Commit throughput. One commit = one shard batch of N records, as a shard task runs it:
   acquire, dedup, load (states and due timers), one state write per distinct key (N/10 keys),
   the N ids into the catalog, one checkpointed 64-byte production per record and the previous
   batch's productions acknowledged, all in one lease-guarded MULTI/EXEC. Sequential, one client,
   4 shards in turn (on Cluster they live on different masters). Reported: commits/s, records/s,
   `ShardStore.round_trips` per commit (constant in N), bytes in / out per commit from the
   servers' `INFO stats` (total_net_input_bytes / total_net_output_bytes, summed over masters),
   client and Redis CPU per commit.
   Bloom on (default) against `ShardConfig(use_bloom=False)`.
2. Catalog reads per record at steady state: two workers (two `SoftStateCache`s) alternate on
   the same 4 shards, batch after batch (each acquire syncs from the commit log), with 0% and 5%
   duplicates (ids the other worker may have committed, from new positions). Every verdict is
   checked. Bloom on against off.
3. Bloom memory per million ids at the default false-positive rate 0.001 and at 0.01, with the
   measured false-positive rate of a filter filled to its expected count.
4. Rebuild: a fresh `SoftStateCache` acquiring a shard whose catalog holds 100k ids.
5. Sync: a worker's acquire after another worker committed K commits (100 ids each) to the
   shard; K beyond the commit log (256) falls back to a rebuild.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import redis

from millstream.bench.dedup import BatchOutcome, shard_batch
from millstream.records import Production
from millstream.settings import mask_url
from millstream.state.bloom import BloomFilter
from millstream.state.catalog import Verdict
from millstream.state.client import connect, is_cluster
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.transaction import COMMIT_LOG_KEEP

SHARDS = 4
COMPUTATION = "bench"

Row = dict[str, Any]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------- server counters


@dataclass(frozen=True)
class Counters:
    bytes_in: int
    bytes_out: int
    server_cpu: float  # seconds, all masters
    client_cpu: float  # seconds, this process
    wall: float

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.bytes_in - other.bytes_in,
            self.bytes_out - other.bytes_out,
            self.server_cpu - other.server_cpu,
            self.client_cpu - other.client_cpu,
            self.wall - other.wall,
        )


class ServerCounters:
    """Bytes in/out and CPU of every master (`INFO stats cpu`), and this process's CPU."""

    def __init__(self, client: Any, url: str) -> None:
        parts = urlsplit(url)
        if is_cluster(client):
            nodes = [(str(n.host), int(n.port)) for n in client.get_primaries()]
        else:
            nodes = [(parts.hostname or "127.0.0.1", parts.port or 6379)]
        self._clients = [
            redis.Redis(
                host=host,
                port=port,
                username=parts.username,
                password=parts.password,
                ssl=parts.scheme == "rediss",
            )
            for host, port in nodes
        ]
        self._overhead = Counters(0, 0, 0.0, 0.0, 0.0)
        first = self.snapshot()
        second = self.snapshot()
        # INFO is traffic too: what one snapshot adds is subtracted from every delta.
        self._overhead = Counters(
            second.bytes_in - first.bytes_in, second.bytes_out - first.bytes_out, 0.0, 0.0, 0.0
        )

    def snapshot(self) -> Counters:
        bytes_in = bytes_out = 0
        server_cpu = 0.0
        for c in self._clients:
            info = c.info("stats", "cpu")
            bytes_in += int(info["total_net_input_bytes"])
            bytes_out += int(info["total_net_output_bytes"])
            server_cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return Counters(bytes_in, bytes_out, server_cpu, time.process_time(), time.perf_counter())

    def since(self, before: Counters) -> Counters:
        wall, client_cpu = time.perf_counter(), time.process_time()
        after = self.snapshot()
        after = Counters(after.bytes_in, after.bytes_out, after.server_cpu, client_cpu, wall)
        return after - before - self._overhead

    def close(self) -> None:
        for c in self._clients:
            c.close()


# ---------------------------------------------------------------- one shard batch


def new_ids(n: int) -> list[bytes]:
    return [uuid.uuid4().bytes for _ in range(n)]


def positions_for(ids: Sequence[bytes]) -> list[bytes]:
    """A fresh delivery position per record (topic:partition:offset-like)."""
    return [b"in:0:" + uuid.uuid4().hex[:12].encode() for _ in ids]


# ---------------------------------------------------------------- 1. commit throughput


class CommitRun:
    """Batches of N new records on `SHARDS` shards of a fresh app, one worker (soft state)."""

    def __init__(self, client: Any, config: ShardConfig, n: int) -> None:
        self.client = client
        self.config = config
        self.n = n
        self.app = f"bench{uuid.uuid4().hex[:10]}"
        self.cache = SoftStateCache()
        self.previous: dict[int, list[Production]] = {}
        self.system_time = _now_ms()

    def inputs(self, batches: int) -> list[tuple[list[bytes], list[bytes]]]:
        out = []
        for _ in range(batches):
            ids = new_ids(self.n)
            out.append((ids, positions_for(ids)))
        return out

    def batch(self, shard: int, ids: list[bytes], positions: list[bytes]) -> BatchOutcome:
        keys = ShardKeys(self.app, COMPUTATION, shard)
        store = ShardStore(self.client, keys, self.config, self.cache)
        previous = self.previous.get(shard, [])
        out = shard_batch(store, ids, positions, self.system_time, previous)
        self.previous[shard] = out.productions
        return out


def commit_sample(client: Any, counters: ServerCounters, n: int, use_bloom: bool) -> Row:
    """One run: `batches` sequential commits of N records on a fresh app."""
    batches = max(12, min(200, 8000 // n))  # about the same wall time for every N
    run = CommitRun(client, ShardConfig(use_bloom=use_bloom), n)
    for shard in range(SHARDS):  # warm-up: the first acquire of each shard builds soft state
        run.batch(shard, *run.inputs(1)[0])
    inputs = run.inputs(batches)  # ids and positions made before the clock starts
    before = counters.snapshot()
    outcomes = [run.batch(b % SHARDS, ids, pos) for b, (ids, pos) in enumerate(inputs)]
    used = counters.since(before)
    assert all(v is Verdict.NEW for o in outcomes for v in o.verdicts)
    trips = [o.round_trips for o in outcomes]
    return {
        "ms_per_commit": 1000 * used.wall / batches,
        "client_cpu_ms": 1000 * used.client_cpu / batches,
        "server_cpu_ms": 1000 * used.server_cpu / batches,
        "bytes_in": used.bytes_in / batches,
        "bytes_out": used.bytes_out / batches,
        "round_trips_min": min(trips),
        "round_trips_max": max(trips),
    }


def interleaved(reps: int, sample: Callable[[bool], Row]) -> dict[str, Any]:
    """Bloom on and off alternately (ABBA...), so both see the same machine load.

    Per variant the median of each figure; `off_over_on` is the median of per-run ratios.
    """
    runs: dict[bool, list[Row]] = {True: [], False: []}
    for rep in range(reps):
        for bloom in (True, False) if rep % 2 == 0 else (False, True):
            runs[bloom].append(sample(bloom))
    out: dict[str, Any] = {}
    for bloom, rows in runs.items():
        summary: Row = {}
        for name in rows[0]:
            values = [r[name] for r in rows]
            if name.endswith("_min"):
                summary[name] = min(values)
            elif name.endswith("_max"):
                summary[name] = max(values)
            else:
                summary[name] = median(values)
        out["on" if bloom else "off"] = summary
    out["off_over_on"] = {
        name: median([ratio(off[name], on[name]) for on, off in zip(*runs.values(), strict=True)])
        for name in runs[True][0]
        if not name.endswith(("_min", "_max"))
    }
    return out


def bench_commits(client: Any, counters: ServerCounters, n: int, reps: int) -> dict[str, Any]:
    result = interleaved(reps, lambda bloom: commit_sample(client, counters, n, bloom))
    result["n"] = n
    return result


# ---------------------------------------------------------------- 2. catalog reads


def catalog_sample(
    client: Any, dup_rate: float, use_bloom: bool, batches: int, per_batch: int, seed: int
) -> Row:
    """Two workers alternate on the same shards; figures over batches 3.. (steady state)."""
    rng = random.Random(seed)
    config = ShardConfig(use_bloom=use_bloom)
    app = f"bench{uuid.uuid4().hex[:10]}"
    workers = [SoftStateCache(), SoftStateCache()]
    history: dict[int, list[bytes]] = {s: [] for s in range(SHARDS)}
    system_time = _now_ms()
    reads = empty = checked = trips = 0
    seconds: list[float] = []
    for batch in range(batches):
        worker = workers[batch % 2]  # Spark does not pin shards to Python workers
        for shard in range(SHARDS):
            store = ShardStore(client, ShardKeys(app, COMPUTATION, shard), config, worker)
            n_dup = min(round(per_batch * dup_rate), len(history[shard]))
            dups = rng.sample(history[shard], n_dup)
            fresh = new_ids(per_batch - n_dup)
            ids = fresh + dups
            rng.shuffle(ids)
            out = shard_batch(store, ids, positions_for(ids), system_time, produce=False)
            dup_set = set(dups)
            for rid, verdict in zip(ids, out.verdicts, strict=True):
                expected = Verdict.DUPLICATE if rid in dup_set else Verdict.NEW
                assert verdict is expected, (rid, verdict, expected)
            history[shard].extend(fresh)
            if batch >= 2:  # steady state: each worker has built its soft state once
                reads += out.catalog_reads
                empty += out.false_positives
                checked += len(ids)
                trips += out.round_trips
                seconds.append(out.seconds)
    return {
        "reads_per_record": reads / checked,
        "empty_reads_per_record": empty / checked,
        "round_trips_per_batch": trips / len(seconds),
        "ms_per_batch": 1000 * median(seconds),
    }


def bench_catalog_reads(
    client: Any, dup_rate: float, reps: int, batches: int, per_batch: int
) -> dict[str, Any]:
    seeds = iter(range(1000, 2000))
    result = interleaved(
        reps, lambda bloom: catalog_sample(client, dup_rate, bloom, batches, per_batch, next(seeds))
    )
    result["duplicates"] = dup_rate
    return result


# ---------------------------------------------------------------- 3. Bloom memory


def bench_bloom_memory(measure_ids: int = 200_000) -> list[Row]:
    rows: list[Row] = []
    for rate in (0.001, 0.01):
        per_million = BloomFilter(1_000_000, rate)
        bloom = BloomFilter(measure_ids, rate)
        bloom.add_many(new_ids(measure_ids))
        probes = new_ids(measure_ids)
        measured = sum(bloom.contains_many(probes)) / len(probes)
        rows.append(
            {
                "fp_rate": rate,
                "bytes_per_million_ids": per_million.memory_bytes,
                "bits_per_id": per_million.size / 1_000_000,
                "hashes": per_million.hashes,
                "measured_fp_rate": measured,
                "default_filter_bytes": BloomFilter(
                    ShardConfig().bloom_expected, rate
                ).memory_bytes,
            }
        )
    return rows


# ---------------------------------------------------------------- 4. rebuild, 5. sync


def fill_shard(client: Any, keys: ShardKeys, total: int, per_commit: int) -> None:
    store = ShardStore(client, keys, ShardConfig(), SoftStateCache())
    system_time = _now_ms()
    for _ in range(total // per_commit):
        ids = new_ids(per_commit)
        shard_batch(store, ids, positions_for(ids), system_time, produce=False)


def bench_rebuild(client: Any, ids: int, reps: int) -> Row:
    keys = ShardKeys(f"bench{uuid.uuid4().hex[:10]}", COMPUTATION, 0)
    fill_shard(client, keys, ids, per_commit=5000)
    seconds: list[float] = []
    trips: list[int] = []
    for _ in range(reps):
        store = ShardStore(client, keys, ShardConfig(), SoftStateCache())
        started = time.perf_counter()
        store.acquire()
        seconds.append(time.perf_counter() - started)
        trips.append(store.round_trips)
        assert store.soft is not None and store.soft.rebuilds == 1
        assert store.soft.bloom is not None
        assert sum(f.count for f in store.soft.bloom.filters.values()) == ids
    return {
        "catalog_ids": ids,
        "seconds": median(seconds),
        "ids_per_s": ids / median(seconds),
        "round_trips": median(trips),
    }


def bench_sync(client: Any, commits: int, ids_per_commit: int, reps: int) -> Row:
    seconds: list[float] = []
    synced: list[int] = []
    rebuilt: list[int] = []
    trips: list[int] = []
    for _ in range(reps):
        keys = ShardKeys(f"bench{uuid.uuid4().hex[:10]}", COMPUTATION, 0)
        worker_a, worker_b = SoftStateCache(), SoftStateCache()
        fill_shard_cache(client, keys, worker_a)  # A is current, then B commits K times
        system_time = _now_ms()
        for _ in range(commits):
            store_b = ShardStore(client, keys, ShardConfig(), worker_b)
            ids = new_ids(ids_per_commit)
            shard_batch(store_b, ids, positions_for(ids), system_time, produce=False)
        store_a = ShardStore(client, keys, ShardConfig(), worker_a)
        before = worker_a.get(keys)
        assert before is not None
        synced_before, rebuilds_before = before.synced_ids, before.rebuilds
        started = time.perf_counter()
        store_a.acquire()
        seconds.append(time.perf_counter() - started)
        trips.append(store_a.round_trips)
        assert store_a.soft is not None
        soft = store_a.soft
        if soft.rebuilds > rebuilds_before:  # the log no longer reaches back: read everything
            assert soft.bloom is not None
            synced.append(sum(f.count for f in soft.bloom.filters.values()))
        else:
            synced.append(soft.synced_ids - synced_before)
        rebuilt.append(soft.rebuilds - rebuilds_before)
    return {
        "other_commits": commits,
        "ids_synced": median(synced),
        "rebuilt": bool(median(rebuilt)),
        "seconds": median(seconds),
        "round_trips": median(trips),
    }


def fill_shard_cache(client: Any, keys: ShardKeys, cache: SoftStateCache) -> None:
    """One batch of 1000 ids by the worker owning `cache`, so its soft state is current."""
    store = ShardStore(client, keys, ShardConfig(), cache)
    ids = new_ids(1000)
    shard_batch(store, ids, positions_for(ids), _now_ms(), produce=False)


# ---------------------------------------------------------------- reporting


def fmt_bytes(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n:.0f} B"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  " + "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for row in rows:
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


@dataclass
class Deployment:
    name: str
    url: str
    results: dict[str, Any] = field(default_factory=dict)


def _trips(row: Row) -> str:
    lo, hi = row["round_trips_min"], row["round_trips_max"]
    return str(lo) if lo == hi else f"{lo}-{hi}"


def run_deployment(dep: Deployment, args: argparse.Namespace) -> None:
    client = connect(dep.url, cached=False)
    counters = ServerCounters(client, dep.url)
    reps: int = args.reps
    started = time.perf_counter()
    try:
        kind = "Redis Cluster, 3 masters" if is_cluster(client) else "single Redis"
        print(f"\n=== {dep.name}: {kind} at {mask_url(dep.url)} ===")

        commits = [bench_commits(client, counters, n, reps) for n in (10, 100, 1000)]
        dep.results["commits"] = commits
        print(
            f"\n1. commit = one shard batch of N records: acquire, dedup, load, N/10 state writes,"
            f"\n   N catalog ids, N 64-byte productions checkpointed, previous batch's acknowledged,"
            f"\n   one MULTI/EXEC. Sequential, one client. Median of {reps} runs per row."
        )
        rows = []
        for r in commits:
            for variant in ("on", "off"):
                v = r[variant]
                rows.append(
                    [
                        str(r["n"]),
                        variant,
                        f"{1000 / v['ms_per_commit']:,.0f}",
                        f"{1000 * r['n'] / v['ms_per_commit']:,.0f}",
                        f"{v['ms_per_commit']:.2f}",
                        _trips(v),
                        fmt_bytes(v["bytes_in"]),
                        fmt_bytes(v["bytes_out"]),
                        f"{v['client_cpu_ms']:.2f}",
                        f"{v['server_cpu_ms']:.2f}",
                    ]
                )
        print_table(
            ["N", "bloom", "commits/s", "records/s", "ms/commit", "round trips", "bytes in", "bytes out", "client CPU ms", "Redis CPU ms"],
            rows,
        )  # fmt: skip
        print("   Bloom off / on (median of paired runs):")
        for r in commits:
            q = r["off_over_on"]
            print(
                f"     N={r['n']:<5} commit time x{q['ms_per_commit']:.2f}, "
                f"client CPU x{q['client_cpu_ms']:.2f}, Redis CPU x{q['server_cpu_ms']:.2f}, "
                f"bytes out x{q['bytes_out']:.2f}"
            )

        catalog = [
            bench_catalog_reads(client, dup, args.catalog_reps, args.batches, args.per_batch)
            for dup in (0.0, 0.05)
        ]
        dep.results["catalog_reads"] = catalog
        print(
            f"\n2. catalog reads per record at steady state: 2 workers (2 SoftStateCaches) alternate"
            f"\n   on {SHARDS} shards, {args.per_batch} records per shard batch, batches 3..{args.batches};"
            f"\n   every acquire syncs the other worker's commit. Median of {args.catalog_reps} runs."
        )
        rows = []
        for r in catalog:
            for variant in ("on", "off"):
                v = r[variant]
                rows.append(
                    [
                        f"{r['duplicates']:.0%}",
                        variant,
                        f"{v['reads_per_record']:.4f}",
                        f"{v['empty_reads_per_record']:.5f}",
                        f"{v['round_trips_per_batch']:.2f}",
                        f"{v['ms_per_batch']:.2f}",
                    ]
                )
        print_table(
            ["duplicates", "bloom", "catalog reads/record", "of which found nothing", "round trips/batch", "ms/batch"],
            rows,
        )  # fmt: skip
        for r in catalog:
            on, off = r["on"], r["off"]
            print(
                f"   {r['duplicates']:.0%} duplicates, Bloom on / off: catalog reads "
                f"x{ratio(on['reads_per_record'], off['reads_per_record']):.3f}, "
                f"batch time x{1 / r['off_over_on']['ms_per_batch']:.2f}"
            )

        rebuild = bench_rebuild(client, args.rebuild_ids, reps)
        dep.results["rebuild"] = rebuild
        print(
            f"\n4. rebuild: a fresh SoftStateCache acquires a shard with {rebuild['catalog_ids']:,} "
            f"catalog ids: {rebuild['seconds']:.3f} s ({rebuild['ids_per_s']:,.0f} ids/s, "
            f"{rebuild['round_trips']:.0f} round trips; median of {reps})"
        )

        sync_rows = [bench_sync(client, k, 100, 3) for k in (0, 1, 10, 100, COMMIT_LOG_KEEP + 44)]
        dep.results["sync"] = sync_rows
        print(
            "\n5. sync: acquire by a worker after another worker committed K commits of 100 ids"
            " (median of 3)"
        )
        print_table(
            ["K", "ids read", "how", "acquire ms", "round trips"],
            [
                [
                    str(r["other_commits"]),
                    f"{r['ids_synced']:,.0f}",
                    f"rebuild (log keeps {COMMIT_LOG_KEEP})"
                    if r["rebuilt"]
                    else ("current" if not r["other_commits"] else "commit log"),
                    f"{1000 * r['seconds']:.2f}",
                    f"{r['round_trips']:.0f}",
                ]
                for r in sync_rows
            ],
        )
        dep.results["seconds"] = time.perf_counter() - started
        print(f"   ({dep.name} took {dep.results['seconds']:.0f} s)")
    finally:
        counters.close()
        client.close()


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--redis-url", help="single Redis (default: start a private one)")
    parser.add_argument("--cluster-url", help="one node of a Redis Cluster (default: start one)")
    parser.add_argument("--only", choices=["single", "cluster"], help="one deployment only")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--reps", type=int, default=6, help="runs per measurement (6)")
    parser.add_argument("--catalog-reps", type=int, default=4, help="runs per catalog case (4)")
    parser.add_argument("--batches", type=int, default=14, help="batches per catalog run (14)")
    parser.add_argument("--per-batch", type=int, default=250, help="records per catalog batch")
    parser.add_argument("--rebuild-ids", type=int, default=100_000, help="catalog ids (100000)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)  # unwind, so the servers we started stop

    begun = time.perf_counter()
    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-state-")))
        deployments: list[Deployment] = []
        starters: list[tuple[str, str | None, Callable[[], str]]] = [
            ("single", args.redis_url, lambda: _start_single(stack, workdir)),
            ("cluster", args.cluster_url, lambda: _start_cluster(stack, workdir)),
        ]
        for name, given, start in starters:
            if args.only and args.only != name:
                continue
            deployments.append(Deployment(name, given or start()))

        print("3. Bloom filter memory (deployment-independent)")
        bloom_rows = bench_bloom_memory()
        results["bloom_memory"] = bloom_rows
        print_table(
            ["fp rate", "per 1M ids", "bits/id", "hashes", "measured fp (filled)", "default filter (200k ids)"],
            [
                [
                    f"{r['fp_rate']:g}",
                    fmt_bytes(r["bytes_per_million_ids"]),
                    f"{r['bits_per_id']:.2f}",
                    str(r["hashes"]),
                    f"{r['measured_fp_rate']:.5f}",
                    fmt_bytes(r["default_filter_bytes"]),
                ]
                for r in bloom_rows
            ],
        )  # fmt: skip

        for dep in deployments:
            run_deployment(dep, args)
            results[dep.name] = dep.results
    results["seconds"] = time.perf_counter() - begun
    print(f"\ntotal {results['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


def _start_single(stack: ExitStack, workdir: Path) -> str:
    from millstream.embedded import start_redis

    service = start_redis(workdir / "redis")
    stack.callback(service.stop)
    return service.url


def _start_cluster(stack: ExitStack, workdir: Path) -> str:
    from millstream.testing.infra import start_redis_cluster

    handle = start_redis_cluster(workdir / "cluster")
    stack.callback(handle.close)
    return handle.url


if __name__ == "__main__":
    sys.exit(main())
