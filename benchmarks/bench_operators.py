"""A window count's shard work, three ways: client CPU per record on a real Redis.

    .venv/bin/python benchmarks/bench_operators.py [--redis-url URL] [--records 20000]
                                                   [--reps 5] [--json out.json]

The same batches of the throughput workload (1,000 Zipf-distributed queries, JSON values,
event times spread over 10 s, one id per record) are routed and run through
`shard_task.run_shard` (acquire, dedup, load, operator, commit: everything a shard task does,
one process, no Spark) for: the count as a hand-written `Computation` (the bench's
`WindowCounter`), as `Topology.window(..., Tumbling(1000), Count())` unlifted, lifted, and
lifted with the ids the injector derives from each record's position (offset marks instead of
the catalog; the other paths read an id header).
Each rep runs every path on a fresh application, interleaved (ABC ABC ...), so drift in the
machine's load spreads over all three. Reported: the median over reps of this process's CPU
seconds per record (`time.process_time`, routing and run_shard only), of wall seconds, of
Redis round trips per shard batch, and of Redis's own CPU per record (`INFO cpu`). Without a
URL a private redis-server is started (and stopped).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from millstream import Count, Topology, Tumbling, json_field, kafka_source
from millstream.bench._topologies import WindowCounter
from millstream.connectors.plan import BatchPlan
from millstream.connectors.routing import route
from millstream.connectors.shard_task import run_shard
from millstream.injectors.record_ids import derived_id
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import Watermark

SHARDS = 8
PATHS = ("hand-written", "window unlifted", "window lifted", "lifted, offset ids")
OFFSET_IDS = "lifted, offset ids"  # ids derived from the Kafka position: offset marks, no catalog


def _topology(app: str, path: str) -> Topology:
    own_ids = path != OFFSET_IDS
    source = kafka_source("q", id_header="event-id" if own_ids else None)
    topology = Topology(app).source("queries", source)
    if path == "hand-written":
        topology.computation(
            "count", WindowCounter(), inputs={"queries": json_field("q")},
            outputs=["window_counts"], shards=SHARDS,
        )  # fmt: skip
    else:
        topology.window(
            "count", stream="queries", key=json_field("q"), window=Tumbling(1000),
            aggregate=Count(), output="window_counts", shards=SHARDS,
            lift=path in ("window lifted", OFFSET_IDS),
        )  # fmt: skip
    return topology


def _rows(records: int, start_ms: int, offset: int, rng: random.Random) -> list[tuple]:
    weights = [1 / (i + 1) for i in range(1000)]
    queries = rng.choices(range(1000), weights, k=records)
    rows = []
    for i, q in enumerate(queries):
        ts = start_ms + rng.randrange(10_000)
        value = json.dumps({"q": f"q{q}", "ts": ts, "sent": ts}).encode()
        rows.append(
            ("queries", uuid.uuid4().bytes, None, value, ts, ts, "q", i % 4, offset + i, None, None)
        )
    return rows


def _offset_ids(rows: list[tuple]) -> list[tuple]:
    """The same rows with the ids the injector derives from their position (no id header)."""
    return [(*r[:1], derived_id(r[6], r[7], r[8]), *r[2:]) for r in rows]


def _plan(app: str, batch_id: int, url: str, watermark: int, now: int) -> BatchPlan:
    return BatchPlan(
        app=app, batch_id=batch_id, redis_url=url, shards=SHARDS,
        shard_config=ShardConfig(), input_watermark=Watermark(watermark, watermark),
        gc_watermark=0, now=now, user_retries=0, fail_stop=False,
        internal_inputs=frozenset(), deliveries={}, in_flight_streams=frozenset(),
    )  # fmt: skip


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def run_path(url: str, path: str, batches: list[list[tuple]], start_ms: int) -> dict[str, Any]:
    app = f"bo-{uuid.uuid4().hex[:8]}"
    spec = _topology(app, path).computations["count"]
    client = redis.Redis.from_url(url)
    cpu = wall = 0.0
    trips: list[int] = []
    redis_before = _redis_cpu(client)
    for batch_id, rows in enumerate(batches):
        # The watermark trails the batch by 10 s: the windows of the batch's records stay open,
        # earlier ones close (their timers fire) as the batches move on.
        plan = _plan(app, batch_id, url, start_ms + 10_000 * batch_id - 10_000, start_ms)
        c0, w0 = time.process_time(), time.perf_counter()
        by_shard: dict[int, list[Any]] = {}
        for shard, item in route(dict(spec.inputs), SHARDS, iter(rows), spec.formats):
            by_shard.setdefault(shard, []).append(item)
        for shard, items in by_shard.items():
            result = run_shard(plan, spec, shard, items)
            trips.append(result.round_trips)
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
    records = sum(len(b) for b in batches)
    return {
        "path": path,
        "client_cpu_us_per_record": 1e6 * cpu / records,
        "wall_us_per_record": 1e6 * wall / records,
        "redis_cpu_us_per_record": 1e6 * (_redis_cpu(client) - redis_before) / records,
        "round_trips_per_shard_batch": statistics.median(trips),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--records", type=int, default=20_000, help="records per batch")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = None
    url = args.redis_url
    if url is None:
        port = 6390 + random.randrange(500)
        folder = tempfile.mkdtemp()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", folder],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        for _ in range(50):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
    try:
        rng = random.Random(24)
        start_ms = 1_800_000_000_000
        runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
        for rep in range(args.reps):
            batches = [
                _rows(args.records, start_ms + 10_000 * b, b * args.records, rng)
                for b in range(args.batches)
            ]
            for path in PATHS:
                rows = [_offset_ids(b) for b in batches] if path == OFFSET_IDS else batches
                runs[path].append(run_path(url, path, rows, start_ms))
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
        summary = {
            path: {
                key: round(statistics.median(r[key] for r in rows), 2)
                for key in rows[0]
                if key != "path"
            }
            for path, rows in runs.items()
        }
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"{args.reps} reps x {args.batches} batches x {args.records} records; load {load}")
        for path, figures in summary.items():
            print(f"  {path:16} {figures}")
        if args.json:
            args.json.write_text(json.dumps({"load": load, "summary": summary, "runs": runs}))
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
