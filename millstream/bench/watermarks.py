"""Scenario 3, low watermark lag per stage of a three-stage pipeline (MillWheel Figure 15).

WindowCounter -> ModelCalculator -> SpikeDetector (the demo's computations) on Zipf traffic
at the first `--rates` rate, event time = send time. The demo's `WatermarkSampler` reads each
stage's published low watermark once per second; lag = wall clock - low watermark.

The same pipeline runs twice, back to back in this bench process on the same broker and
Redis: with MILLSTREAM_RUNTIME=queries (one Spark query per computation, the stages joined by
Kafka topics) and with MILLSTREAM_RUNTIME=fused (one query, productions handed to the next
stage inside the micro-batch); both with `delivery="auto"` and MILLSTREAM_IDLE_SLACK_MS=500
(`IDLE_SLACK_MS`: a caught-up partition's watermark is now - 0.5 s, a floor under every
stage's lag). Each run's batches are profiled from what the runtime leaves in Redis
(`BatchProfile`): batch seconds per computation and, for the fused runtime, its phases.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from millstream.bench._harness import (
    PROGRESS_FILE,
    RUNTIMES,
    BatchProfile,
    Bench,
    metric,
    millstream_pipeline,
    print_table,
    say,
    spark_progress,
    trigger_line,
    write_json,
)
from millstream.bench._topologies import THREE_STAGES
from millstream.bench._workload import RateProducer, new_topic
from millstream.demo.observe import WatermarkSampler

NAME = "watermarks"
SKIP_S = 5.0  # the first seconds of traffic: stages are still catching up with the start
IDLE_SLACK_MS = 500  # MILLSTREAM_IDLE_SLACK_MS of both runs (issue #16)


def plot(path: Path, runs: dict[str, dict[str, Any]], rate: float) -> None:
    """Lag per stage over time, one panel per runtime, on the same scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), sharey=True, squeeze=False)
    for ax, (runtime, found) in zip(axes[0], runs.items(), strict=True):
        start_ms = found["traffic_start_ms"]
        for stage in THREE_STAGES:
            points = [
                ((s["t"] - start_ms) / 1000, s[stage] / 1000)
                for s in found["samples"]
                if s.get(stage) is not None
            ]
            if points:
                ax.plot(*zip(*points, strict=True), label=stage, linewidth=1.2)
        ax.set_xlabel(f"seconds since traffic start ({rate:.0f} events/s)")
        ax.set_title(f"MILLSTREAM_RUNTIME={runtime}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("low watermark lag (s)")
    fig.suptitle(
        f"Low watermark lag per stage, sampled once per second (cf. MillWheel Fig. 15); "
        f"idle slack {IDLE_SLACK_MS} ms",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _measure(bench: Bench, rate: float, seconds: float, runtime: str) -> dict[str, Any]:
    """One three-stage pipeline process under `rate` events/s; lag statistics per stage."""
    delivery = "auto"
    app = f"bw-{uuid.uuid4().hex[:8]}"
    folder = bench.run_dir(f"{NAME}-{runtime}")
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
    profile = BatchProfile(client, app, THREE_STAGES)
    say(
        f"{NAME}: three stages, {rate:.0f} events/s for {seconds:.0f}s, "
        f"MILLSTREAM_RUNTIME={runtime}, MILLSTREAM_IDLE_SLACK_MS={IDLE_SLACK_MS}, "
        f"delivery {delivery}"
    )
    with millstream_pipeline(
        bench, config, folder, runtime=runtime, idle_slack_ms=IDLE_SLACK_MS
    ) as process:
        process.wait_for(
            "every stage's first batch",
            lambda: all(metric(client, app, s, "batches") > 0 for s in THREE_STAGES),
            timeout=900,
        )
        producer = RateProducer(bench.kafka, topic, rate, seconds)
        sampler.start()
        profile.start()
        producer.start()
        while producer.is_alive():
            if not process.alive():
                raise RuntimeError(f"pipeline exited; log {process.log_path}:\n{process.tail()}")
            producer.join(0.5)
        time.sleep(5)  # the tail: watermarks catch up after the last event
        sampler.stop()
        profile.stop()
        peak = process.peak_rss_mb
        restarts = process.restarts
        batches = {s: metric(client, app, s, "batches") for s in THREE_STAGES}
        records = {s: metric(client, app, s, "records") for s in THREE_STAGES}
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
        "runtime": runtime,
        "delivery": delivery,
        "idle_slack_ms": IDLE_SLACK_MS,
        "app": app,
        "log": str(process.log_path),
        "stages": stats,
        "batches": batches,
        "records": records,
        "sent": producer.sent,
        # The first stage counted every event within the 5 s tail (else it had not caught up).
        "caught_up": records[THREE_STAGES[0]] >= producer.sent,
        "profile": profile.summary(),
        "spark": spark_progress(folder / PROGRESS_FILE, f"{app}.", start_ms),
        "samples": sampler.samples,
        "traffic_start_ms": start_ms,
        "peak_rss_mb": peak,
        "query_restarts": restarts,
    }


def profile_line(queries: dict[str, Any], fused: dict[str, Any]) -> str:
    """Batch seconds p50 per stage (queries) and the fused batch's phases p50, over the batches
    that took input, in one line."""

    def busy(entry: dict[str, Any]) -> dict[str, Any]:
        return entry.get("with_input") or entry

    def p50(entry: dict[str, Any]) -> Any:
        return (busy(entry).get("seconds") or {}).get("p50")

    own = busy(fused.get("#fused", {}))
    line = "batches with input, p50 s: queries " + "/".join(
        str(p50(queries.get(s, {}))) for s in THREE_STAGES
    )
    line += f" (per stage's batch); fused {p50(fused.get(THREE_STAGES[0], {}))} (whole batch"
    if own.get("phases"):
        line += ": " + ", ".join(f"{k} {v['p50']}" for k, v in own["phases"].items())
    return line + f"; {own.get('batches', 0)} such batches seen)"


def run(bench: Bench) -> dict[str, Any]:
    """The per-computation queries, then the fused runtime, one after the other on the same
    machine, both with `delivery="auto"` and MILLSTREAM_IDLE_SLACK_MS=500."""
    rate = bench.rates[0]
    seconds = max(bench.rate_seconds, 20.0) if bench.quick else max(2 * bench.rate_seconds, 30.0)
    runs = {runtime: _measure(bench, rate, seconds, runtime) for runtime in RUNTIMES}
    table = print_table(
        f"low watermark lag per stage at {rate:.0f} events/s (after the first {SKIP_S:.0f}s), "
        f"MILLSTREAM_IDLE_SLACK_MS={IDLE_SLACK_MS}, delivery auto",
        ["runtime", "stage", "samples", "median s", "p95 s", "max s", "batches", "records"],
        [
            [
                r["runtime"],
                s,
                r["stages"][s]["samples"],
                r["stages"][s]["median_s"],
                r["stages"][s]["p95_s"],
                r["stages"][s]["max_s"],
                r["batches"][s],
                r["records"][s],
            ]
            for r in runs.values()
            for s in THREE_STAGES
        ],
    )
    queries, fused = runs["queries"], runs["fused"]
    ratios = {
        f"{s} median fused/queries": (
            round(fused["stages"][s]["median_s"] / queries["stages"][s]["median_s"], 3)
            if queries["stages"][s]["median_s"] and fused["stages"][s]["median_s"] is not None
            else None
        )
        for s in THREE_STAGES
    }
    memory = (
        f"sent {queries['sent']} (queries) and {fused['sent']} (fused) events; peak RSS: "
        f"queries {queries['peak_rss_mb']} MB, fused {fused['peak_rss_mb']} MB; query restarts: "
        f"queries {queries['query_restarts']}, fused {fused['query_restarts']}"
    )
    behind = [r["runtime"] for r in runs.values() if not r["caught_up"]]
    if behind:
        memory += f"; not caught up 5 s after the traffic: {', '.join(behind)}"
    memory += "\n" + profile_line(queries["profile"], fused["profile"])
    for r in runs.values():
        memory += f"\n{r['runtime']}: " + trigger_line(r["spark"])
    print(f"  {memory}", flush=True)
    print("  ratios: " + ", ".join(f"{k} {v}" for k, v in ratios.items()) + "\n", flush=True)
    table += "\n" + memory
    png = bench.output / "watermark_lag.png"
    plot(png, runs, rate)
    result = {
        "scenario": NAME,
        "rate": rate,
        "seconds": seconds,
        "idle_slack_ms": IDLE_SLACK_MS,
        "delivery": "auto",
        "runtimes": runs,
        "ratios": ratios,
        "table": table,
        "plots": [str(png)],
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
