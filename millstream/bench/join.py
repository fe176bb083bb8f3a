"""Scenario 7, the Photon join: click -> joined output latency, joined throughput, registry cost.

Every pipeline is the Photon demo's (`millstream.demo.photon_worker`: clicks joined with the
queries that showed their ads, through the IdRegistry, output to `<app>.joined` by the
transactional Kafka sink), run as `millstream bench` runs every pipeline: its own process, the
bench's environment, exactly-once on.

1. Latency: one pipeline, clicks at `JOIN_RATE` (1,000/s) for `rate_seconds`, each query sent
   50-300 ms before its click (on time). Click produced -> joined output visible to a
   read_committed consumer, p50/p95/p99, the first `WARM_S` excluded.
2. Throughput: `clicks` clicks and their queries pre-loaded, then one pipeline started; joined
   clicks per second from the joiner's first look-up to every click delivered (start-up
   excluded). Then the same with two pipelines active-active on fresh topics and registry:
   every click delivered once between them, the rest lost races.
3. The registry gate's cost, from the joiner's own counters in each run: Redis round trips per
   shard batch that registered output (`registry_round_trips / registry_batches`), beside the
   clicks such a batch registered. One round trip per shard batch however many clicks is the
   claim; the two loads (1,000/s and pre-loaded) give two very different batch sizes.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Producer

from millstream.bench._harness import (
    Bench,
    Process,
    metric,
    percentiles,
    print_table,
    say,
    write_json,
)
from millstream.connectors.topics import ensure_topics
from millstream.demo.photon_traffic import OutputWatcher, Player, plan_traffic

NAME = "join"
JOIN_RATE = 1000.0  # clicks/s of the latency run (the target load)
WARM_S = 15.0  # the first Spark jobs start Python workers: a backlog to catch up
PARTITIONS = 4
SHARDS = 4
JOINER = "joiner"
COUNTERS = ("lookups", "joined", "joined_on_retry", "retries", "lost_races", "registered",
            "delivered", "registry_batches", "registry_round_trips", "registry_commands")  # fmt: skip


def _config(run: str, give_up_ms: int) -> dict[str, Any]:
    return {
        "clicks_topic": f"{run}-clicks",
        "queries_topic": f"{run}-queries",
        "registry": run,
        "give_up_ms": give_up_ms,
        "max_out_of_order_ms": 1000,
        "shards": SHARDS,
    }


def _pipelines(
    bench: Bench, run: str, apps: list[str], give_up_ms: int, max_batch: int = 200_000
) -> list[Process]:
    folder = bench.run_dir(run)
    config = _config(run, give_up_ms)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2))
    ensure_topics(
        bench.kafka,
        {config["clicks_topic"]: PARTITIONS, config["queries_topic"]: PARTITIONS,
         **{f"{app}.joined": PARTITIONS for app in apps}},
    )  # fmt: skip
    for app in apps:
        (folder / app).mkdir()
    return [
        Process(
            [sys.executable, "-m", "millstream.demo.photon_worker", str(path), app],
            bench.pipeline_env(app, folder / app, max_batch=max_batch),
            folder / f"pipeline-{app}.log",
        )
        for app in apps
    ]


def _counters(client: Any, apps: list[str]) -> dict[str, int]:
    return {name: sum(metric(client, app, JOINER, name) for app in apps) for name in COUNTERS}


def _gate_cost(counters: dict[str, int]) -> dict[str, float | None]:
    batches = counters["registry_batches"]
    if not batches:
        return {"round_trips_per_batch": None, "clicks_per_batch": None, "scripts_per_batch": None}
    return {
        "round_trips_per_batch": round(counters["registry_round_trips"] / batches, 3),
        "clicks_per_batch": round((counters["registered"] + counters["lost_races"]) / batches, 1),
        "scripts_per_batch": round(counters["registry_commands"] / batches, 2),
    }


def latency_run(bench: Bench, rate: float, seconds: float) -> dict[str, Any]:
    """One pipeline at `rate` clicks/s, queries on time: click -> joined output visible."""
    run = f"benchjoin-lat-{uuid.uuid4().hex[:6]}"
    app = f"{run}-a"
    client = bench.redis()
    (pipeline,) = _pipelines(bench, run, [app], give_up_ms=30_000)
    topics = {"clicks": f"{run}-clicks", "queries": f"{run}-queries"}
    plan = plan_traffic(seconds + WARM_S, rate, seed=7, max_delay_s=2.0, late=0.0, never=0.0,
                        duplicates=0.0)  # fmt: skip
    watcher = OutputWatcher(bench.kafka, {app: f"{app}.joined"})
    with pipeline:
        pipeline.wait_for("the joiner's first batch",
                          lambda: metric(client, app, JOINER, "batches") > 0, 240)  # fmt: skip
        start = int(time.time() * 1000) + 500
        player = Player(plan, start, bench.kafka, topics)
        watcher.start()
        player.start()
        player.join()
        if player.error is not None:
            raise RuntimeError(f"join latency: traffic failed: {player.error}")
        pipeline.wait_for("every click joined",
                          lambda: len(watcher.seen.first_seen) >= len(plan.fates), 120)  # fmt: skip
        counters = _counters(client, [app])
        peak = pipeline.peak_rss_mb
    watcher.stop()
    warm_until = start + WARM_S * 1000
    seen, sent = watcher.seen.first_seen, player.sent_clicks
    latencies = [(seen[c][0] - sent[c]) / 1000 for c in plan.fates
                 if c in seen and c in sent and sent[c] >= warm_until]  # fmt: skip
    twice = sum(1 for ids in watcher.seen.outputs.values() if len(ids) > 1)
    return {
        "rate": rate,
        "seconds": seconds,
        "clicks": len(plan.fates),
        "latency_s": percentiles(latencies),
        "output_twice": twice,
        "counters": counters,
        "registry": _gate_cost(counters),
        "peak_rss_mb": peak,
    }


def _preload(bench: Bench, topics: dict[str, str], clicks: int) -> None:
    """Every query, then every click, stamped now: nothing waits for a late query."""
    producer = Producer({**bench.kafka, "linger.ms": 20, "enable.idempotence": True,
                         "queue.buffering.max.messages": 500_000})  # fmt: skip
    now = int(time.time() * 1000)
    for kind in ("queries", "clicks"):
        for i in range(clicks):
            if kind == "queries":
                rid, body = f"q{i}", {"query_id": f"q{i}", "terms": f"terms {i % 500}"}
            else:
                rid, body = f"c{i}", {"click_id": f"c{i}", "query_id": f"q{i}", "ad": f"ad{i % 50}"}
            while True:
                try:
                    producer.produce(topics[kind], json.dumps(body).encode(),
                                     headers=[("event-id", rid.encode())], timestamp=now)  # fmt: skip
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("join throughput: the pre-load could not be delivered")


def throughput_run(bench: Bench, clicks: int, pipelines: int) -> dict[str, Any]:
    """`clicks` pre-loaded clicks and queries, then `pipelines` pipelines: joined clicks/s.

    As the throughput scenario measures: admission control cuts the load into about ten
    micro-batches per pipeline, and the rate runs from the first delivered output (start-up
    and the first batch excluded) to the last."""
    run = f"benchjoin-tp{pipelines}-{uuid.uuid4().hex[:6]}"
    apps = [f"{run}-{chr(ord('a') + i)}" for i in range(pipelines)]
    client = bench.redis()
    processes = _pipelines(bench, run, apps, give_up_ms=60_000, max_batch=max(2000, clicks // 10))
    _preload(bench, {"clicks": f"{run}-clicks", "queries": f"{run}-queries"}, clicks)
    say(f"{NAME}: {clicks} clicks and queries pre-loaded; {pipelines} pipeline(s) starting")
    for process in processes:
        process.__enter__()
    try:
        first = processes[0].wait_for(
            "the first joined output delivered",
            lambda: _counters(client, apps)["delivered"] > 0, 300,
        )  # fmt: skip
        first_n = _counters(client, apps)["delivered"]
        done = processes[0].wait_for(
            f"{clicks} joined clicks delivered",
            lambda: _counters(client, apps)["delivered"] >= clicks, 600,
        )  # fmt: skip
        counters = _counters(client, apps)
        per_app = {app: metric(client, app, JOINER, "delivered") for app in apps}
        peaks = [p.peak_rss_mb for p in processes]
    finally:
        for process in processes:
            process.stop()
    seconds = done - first
    return {
        "pipelines": pipelines,
        "clicks": clicks,
        "first_progress_clicks": first_n,
        "seconds": round(seconds, 2),
        "clicks_per_s": round((clicks - first_n) / seconds, 1) if clicks > first_n else None,
        "delivered_per_pipeline": per_app,
        "counters": counters,
        "registry": _gate_cost(counters),
        "peak_rss_mb": peaks,
    }


def run(bench: Bench) -> dict[str, Any]:
    rate = 300.0 if bench.quick else JOIN_RATE
    seconds = 10.0 if bench.quick else max(20.0, bench.rate_seconds)
    clicks = 20_000 if bench.quick else 100_000
    say(f"{NAME}: latency at {rate:.0f} clicks/s for {seconds:.0f}s (+{WARM_S:.0f}s warm-up)")
    latency = latency_run(bench, rate, seconds)
    throughput = [throughput_run(bench, clicks, n) for n in (1, 2)]
    lat = latency["latency_s"]
    table = print_table(
        "Photon join (exactly-once, registry gate, transactional Kafka output)",
        ["run", "clicks", "clicks/s", "p50 s", "p95 s", "p99 s", "registry trips/batch",
         "clicks/batch", "lost races"],
        [
            ["latency", latency["clicks"], rate, lat["p50"], lat["p95"], lat["p99"],
             latency["registry"]["round_trips_per_batch"], latency["registry"]["clicks_per_batch"],
             latency["counters"]["lost_races"]],
            *[[f"throughput x{t['pipelines']}", t["clicks"], t["clicks_per_s"], "-", "-", "-",
               t["registry"]["round_trips_per_batch"], t["registry"]["clicks_per_batch"],
               t["counters"]["lost_races"]] for t in throughput],
        ],
    )  # fmt: skip
    result = {"scenario": NAME, "latency": latency, "throughput": throughput, "table": table}
    write_json(bench.output / f"{NAME}.json", result)
    return result
