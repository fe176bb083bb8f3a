"""Scenario 5, scaling: the throughput scenario's exactly-once window count with Spark
`local[1]` against `local[2]` (8 shards), and with 2, 4 and 8 shards (`local[2]`).

Same pre-loaded topic for every run (the throughput scenario's, when it ran first in the same
`millstream bench`, whose exactly-once run is then the `local[2]`, 8-shard point). On a 2-core machine shared with other work, `local[2]`
can at most double what `local[1]` does; shard counts change how the work is cut into Spark
tasks and Redis transactions. Runs with the same master share one pipeline process (one
Spark session), one after the other.
"""

from __future__ import annotations

from typing import Any

from millstream.bench._harness import Bench, print_table, say, write_json
from millstream.bench._workload import new_topic, preload
from millstream.bench.throughput import Variant, run_millstream

NAME = "scaling"
CONFIGS = (("local[1]", 8), ("local[2]", 2), ("local[2]", 4), ("local[2]", 8))


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
    by = {(r["master"], r["shards"]): r["events_per_s"] for r in rows}
    base = by[("local[2]", 8)]
    ratios = {
        "local[2]/local[1] (8 shards)": round(base / by[("local[1]", 8)], 3)
        if by[("local[1]", 8)]
        else None,
        "4 shards / 2 shards": round(by[("local[2]", 4)] / by[("local[2]", 2)], 3)
        if by[("local[2]", 2)]
        else None,
        "8 shards / 2 shards": round(base / by[("local[2]", 2)], 3)
        if by[("local[2]", 2)]
        else None,
    }
    table = print_table(
        f"scaling: millstream exactly-once window count, {events:,} events",
        ["master", "shards", "events/s", "startup s", "steady s", "peak RSS MB", "restarts"],
        [
            [
                r["master"],
                r["shards"],
                r["events_per_s"],
                r["startup_s"],
                r["steady_s"],
                r["peak_rss_mb"],
                r["query_restarts"],
            ]
            for r in rows
        ],
    )
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
