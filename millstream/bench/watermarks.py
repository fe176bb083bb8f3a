"""Scenario 3, low watermark lag per stage of a three-stage pipeline (MillWheel Figure 15).

WindowCounter -> ModelCalculator -> SpikeDetector (the demo's computations) on Zipf traffic
at the first `--rates` rate, event time = send time. The demo's `WatermarkSampler` reads each
stage's published low watermark once per second; lag = wall clock - low watermark.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from millstream.bench._harness import (
    Bench,
    metric,
    millstream_pipeline,
    print_table,
    say,
    write_json,
)
from millstream.bench._topologies import THREE_STAGES
from millstream.bench._workload import RateProducer, new_topic
from millstream.demo.observe import WatermarkSampler

NAME = "watermarks"
SKIP_S = 5.0  # the first seconds of traffic: stages are still catching up with the start


def plot(path: Path, samples: list[dict[str, Any]], start_ms: int, rate: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for stage in THREE_STAGES:
        points = [
            ((s["t"] - start_ms) / 1000, s[stage] / 1000)
            for s in samples
            if s.get(stage) is not None
        ]
        if points:
            ax.plot(*zip(*points, strict=True), label=stage, linewidth=1.2)
    ax.set_xlabel(f"seconds since traffic start ({rate:.0f} events/s)")
    ax.set_ylabel("low watermark lag (s)")
    ax.set_title("Low watermark lag per stage, sampled once per second (cf. MillWheel Fig. 15)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _measure(bench: Bench, rate: float, seconds: float, delivery: str) -> dict[str, Any]:
    """One three-stage pipeline process under `rate` events/s; lag statistics per stage."""
    app = f"bw-{uuid.uuid4().hex[:8]}"
    folder = bench.run_dir(f"{NAME}-{delivery}")
    topic = new_topic(bench.kafka, f"{app}-in")
    out = new_topic(bench.kafka, f"{app}-anomalies")
    config = {
        "app": app,
        "kind": "three_stage",
        "bootstrap": bench.bootstrap,
        "input_topic": topic,
        "output_topic": out,
        "shards": 8,
        "delivery": delivery,
    }
    client = bench.redis()
    sampler = WatermarkSampler(client, app, THREE_STAGES)
    say(f"{NAME}: three stages, {rate:.0f} events/s for {seconds:.0f}s, delivery by {delivery}")
    with millstream_pipeline(bench, config, folder) as process:
        process.wait_for(
            "every stage's first batch",
            lambda: all(metric(client, app, s, "batches") > 0 for s in THREE_STAGES),
            timeout=900,
        )
        producer = RateProducer(bench.kafka, topic, rate, seconds)
        sampler.start()
        producer.start()
        while producer.is_alive():
            if not process.alive():
                raise RuntimeError(f"pipeline exited; log {process.log_path}:\n{process.tail()}")
            producer.join(0.5)
        time.sleep(5)  # the tail: watermarks catch up after the last event
        sampler.stop()
        peak = process.peak_rss_mb
        restarts = process.restarts
        batches = {s: metric(client, app, s, "batches") for s in THREE_STAGES}
    start_ms = producer.started_ms
    steady = [s for s in sampler.samples if s["t"] >= start_ms + SKIP_S * 1000]
    stats: dict[str, dict[str, float | None]] = {}
    for stage in THREE_STAGES:
        lags = sorted(s[stage] / 1000 for s in steady if s.get(stage) is not None)
        stats[stage] = {
            "samples": len(lags),
            "median_s": round(statistics.median(lags), 3) if lags else None,
            "p95_s": round(lags[min(len(lags) - 1, int(0.95 * len(lags)))], 3) if lags else None,
            "max_s": round(lags[-1], 3) if lags else None,
        }
    return {
        "delivery": delivery,
        "stages": stats,
        "batches": batches,
        "samples": sampler.samples,
        "traffic_start_ms": start_ms,
        "peak_rss_mb": peak,
        "query_restarts": restarts,
    }


def run(bench: Bench) -> dict[str, Any]:
    """The default (`delivery="auto"`: the shard tasks deliver the internal streams, the
    driver the transactional sink's stream), then the same pipeline with every delivery by the
    driver, one after the other on the same machine; the plot shows the default."""
    rate = bench.rates[0]
    seconds = max(bench.rate_seconds, 20.0) if bench.quick else max(2 * bench.rate_seconds, 30.0)
    runs = [_measure(bench, rate, seconds, delivery) for delivery in ("auto", "driver")]
    table = print_table(
        f"low watermark lag per stage at {rate:.0f} events/s (after the first {SKIP_S:.0f}s)",
        ["delivery", "stage", "samples", "median s", "p95 s", "max s", "batches"],
        [
            [
                r["delivery"],
                s,
                r["stages"][s]["samples"],
                r["stages"][s]["median_s"],
                r["stages"][s]["p95_s"],
                r["stages"][s]["max_s"],
                r["batches"][s],
            ]
            for r in runs
            for s in THREE_STAGES
        ],
    )
    main, driver = runs
    ratios = {
        f"{s} median driver/auto": (
            round(driver["stages"][s]["median_s"] / main["stages"][s]["median_s"], 3)
            if main["stages"][s]["median_s"] and driver["stages"][s]["median_s"]
            else None
        )
        for s in THREE_STAGES
    }
    print("  ratios: " + ", ".join(f"{k} {v}" for k, v in ratios.items()) + "\n", flush=True)
    png = bench.output / "watermark_lag.png"
    plot(png, main["samples"], main["traffic_start_ms"], rate)
    result = {
        "scenario": NAME,
        "rate": rate,
        "seconds": seconds,
        **main,
        "driver_delivery": driver,
        "ratios": ratios,
        "table": table,
        "plots": [str(png)],
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
