"""Scenario 5, scaling: the throughput scenario's exactly-once window count (8 shards) on Spark
`local[1]` and `local[2]`, with 2 and 4 shards on `local[2]`, and on a Spark standalone cluster
of 1, 2 and 4 one-core workers (`millstream.testing.spark_cluster`: each worker its own
loopback host, every batch's shard work in executors), all in the same run.

Same pre-loaded topic for every run (the throughput scenario's, when it ran first in the same
`millstream bench`, whose exactly-once run is then the `local[2]`, 8-shard point). Runs with the
same master share one pipeline process (one Spark session), one after the other; each
standalone size gets a cluster of its own. On a 2-core machine shared with the broker and
Redis, two workers can at most double one, and four oversubscribe the cores: what the figures
show is what the design costs per worker (scheduling, Python workers, Redis round trips),
not what a larger machine would give. Each row has the Redis commands per record.
"""

from __future__ import annotations

from typing import Any

from millstream.bench._harness import Bench, print_table, say, write_json
from millstream.bench._workload import new_topic, preload
from millstream.bench.throughput import Variant, run_millstream
from millstream.testing.spark_cluster import driver_conf, standalone_cluster

NAME = "scaling"
CONFIGS = (("local[1]", 8), ("local[2]", 2), ("local[2]", 4), ("local[2]", 8))
WORKERS = (1, 2, 4)  # standalone cluster sizes, 8 shards each
WORKER_MEMORY_MB = 1024


def run_standalone(bench: Bench, topic: str, events: int, workers: int) -> dict[str, Any]:
    """The 8-shard window count on a fresh standalone cluster of `workers` 1-core workers."""
    folder = bench.run_dir(f"{NAME}-standalone-{workers}")
    with standalone_cluster(folder / "spark", workers, WORKER_MEMORY_MB) as cluster:
        say(f"{NAME}: standalone cluster {cluster.master}, {workers} workers of 1 core")
        conf = driver_conf(folder / "spark-conf", cores=workers)
        env = {"SPARK_CONF_DIR": str(conf), "MILLSTREAM_SMALL_BATCH_ROWS": "0"}
        variant = Variant(f"standalone-{workers}w", shards=8)
        [row] = run_millstream(
            bench, topic, events, [variant], cluster.master, env, f"standalone-{workers}"
        )
    row.update(master=f"standalone x{workers}", workers=workers)
    return row


def run(bench: Bench) -> dict[str, Any]:
    events = bench.events
    earlier = bench.results.get("throughput")
    reused: dict[str, Any] | None = None
    if earlier is not None:  # same events, same run: its exactly-once run is local[2], 8 shards
        topic = earlier["input_topic"]
        reused = next(r for r in earlier["runs"] if r["system"] == "millstream-eo")
        say(f"{NAME}: reusing the throughput scenario's topic and its local[2], 8 shards run")
    else:
        topic = new_topic(bench.kafka, "bench-scaling")
        say(f"{NAME}: pre-loading {events} events into {topic}")
        preload(bench.kafka, topic, events)
    rows: list[dict[str, Any]] = []
    for master in sorted({m for m, _ in CONFIGS}):
        variants = []
        for m, shards in CONFIGS:
            if m != master:
                continue
            if reused is not None and (m, shards) == (reused["master"], reused["shards"]):
                rows.append({**reused, "reused_from": "throughput"})
                continue
            variants.append(Variant(f"{master}-{shards}", shards=shards))
        if variants:
            rows.extend(run_millstream(bench, topic, events, variants, master=master))
    rows.sort(key=lambda r: (r["master"], r["shards"]))
    for workers in WORKERS:
        rows.append(run_standalone(bench, topic, events, workers))
    for row in rows:
        cores = row.get("workers") or (1 if row["master"] == "local[1]" else 2)
        rate = row["events_per_s"]
        row["events_per_s_per_core"] = round(rate / cores, 1) if rate else None
    by = {(r["master"], r["shards"]): r["events_per_s"] for r in rows}
    base = by[("local[2]", 8)]
    ratios = {
        "local[2]/local[1] (8 shards)": _ratio(base, by[("local[1]", 8)]),
        "4 shards / 2 shards": _ratio(by[("local[2]", 4)], by[("local[2]", 2)]),
        "8 shards / 2 shards": _ratio(base, by[("local[2]", 2)]),
        **{
            f"standalone {n} workers / 1 worker": _ratio(
                by[(f"standalone x{n}", 8)], by[("standalone x1", 8)]
            )
            for n in WORKERS[1:]
        },
        "standalone 2 workers / local[2]": _ratio(by[("standalone x2", 8)], base),
    }
    table = print_table(
        f"scaling: millstream exactly-once window count, {events:,} events",
        ["master", "shards", "events/s", "ev/s per core", "Redis cmds/record", "startup s",
         "steady s", "peak RSS MB", "restarts"],
        [
            [
                r["master"], r["shards"], r["events_per_s"], r["events_per_s_per_core"],
                r.get("redis_commands_per_record"), r["startup_s"], r["steady_s"],
                r["peak_rss_mb"], r["query_restarts"],
            ]
            for r in rows
        ],
    )  # fmt: skip
    print("  ratios: " + ", ".join(f"{k} {v}" for k, v in ratios.items()) + "\n", flush=True)
    result = {
        "scenario": NAME,
        "events": events,
        "runs": rows,
        "ratios": ratios,
        "table": table,
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None
