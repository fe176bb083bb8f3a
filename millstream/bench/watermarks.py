"""Scenario 3, low watermark lag per stage of a three-stage pipeline (MillWheel Figure 15).

WindowCounter -> ModelCalculator -> SpikeDetector (the demo's computations) on Zipf traffic
at the first `--rates` rate, event time = send time. The demo's `WatermarkSampler` reads each
stage's published low watermark once per second; lag = wall clock - low watermark.

The pipeline is one fused query (productions handed to the next stage inside the
micro-batch) and runs with MILLSTREAM_IDLE_SLACK_MS=500 (`IDLE_SLACK_MS`: a caught-up
partition's watermark is now - 0.5 s, a floor under every stage's lag). Its batches are
profiled from what the runtime leaves in Redis (`BatchProfile`): batch seconds per computation
and the fused batch's phases.

With `--driver-read ab` the pipeline runs twice at the same rate, first with
MILLSTREAM_DRIVER_READ=off (result key `millstream_driver_read_off`), then on (`millstream`):
lag per stage and the batch profile (phases, `read` included) of each.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from millstream.bench._broker_load import CpuSeries, listening_pid, over_time_line, per_window
from millstream.bench._harness import (
    PROGRESS_FILE,
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
WINDOW_S = 10.0  # the run's figures over time are given per this many seconds of traffic
IDLE_SLACK_MS = 500  # MILLSTREAM_IDLE_SLACK_MS of the run (issue #16)


def plot(path: Path, found: dict[str, Any], rate: float, off: dict[str, Any] | None = None) -> None:
    """Lag per stage over time; `off`, when given, the driver-read-off run's, dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    runs = (
        [(found, "", "-")]
        if off is None
        else [(off, ", read off", "--"), (found, ", read on", "-")]
    )
    for run, suffix, style in runs:
        start_ms = run["traffic_start_ms"]
        for index, stage in enumerate(THREE_STAGES):
            points = [
                ((s["t"] - start_ms) / 1000, s[stage] / 1000)
                for s in run["samples"]
                if s.get(stage) is not None
            ]
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    style,
                    label=stage + suffix,
                    linewidth=1.2,
                    color=f"C{index}",
                )
    ax.set_xlabel(f"seconds since traffic start ({rate:.0f} events/s)")
    ax.set_ylabel("low watermark lag (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(
        f"Low watermark lag per stage, sampled once per second (cf. MillWheel Fig. 15); "
        f"idle slack {IDLE_SLACK_MS} ms",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _measure(bench: Bench, rate: float, seconds: float, driver_read: str) -> dict[str, Any]:
    """One three-stage pipeline process under `rate` events/s, MILLSTREAM_DRIVER_READ set to
    `driver_read`; lag statistics per stage."""
    app = f"bw-{uuid.uuid4().hex[:8]}"
    folder = bench.run_dir(NAME)
    topic = new_topic(bench.kafka, f"{app}-in")
    out = new_topic(bench.kafka, f"{app}-anomalies")
    config = {
        "app": app,
        "kind": "three_stage",
        "bootstrap": bench.bootstrap,
        "input_topic": topic,
        "output_topic": out,
        "shards": 8,
    }
    client = bench.redis()
    sampler = WatermarkSampler(client, app, THREE_STAGES)
    profile = BatchProfile(client, app, THREE_STAGES)
    say(
        f"{NAME}: three stages, {rate:.0f} events/s for {seconds:.0f}s, "
        f"MILLSTREAM_IDLE_SLACK_MS={IDLE_SLACK_MS}, MILLSTREAM_DRIVER_READ={driver_read}"
    )
    with millstream_pipeline(
        bench, config, folder, idle_slack_ms=IDLE_SLACK_MS, driver_read=driver_read
    ) as process:
        process.wait_for(
            "every stage's first batch",
            lambda: all(metric(client, app, s, "batches") > 0 for s in THREE_STAGES),
            timeout=900,
        )
        producer = RateProducer(bench.kafka, topic, rate, seconds)
        broker_pid = listening_pid(bench.bootstrap)
        broker = CpuSeries(broker_pid) if broker_pid is not None else None
        sampler.start()
        profile.start()
        producer.start()
        if broker is not None:
            broker.start()
        try:
            while producer.is_alive():
                if not process.alive():
                    raise RuntimeError(
                        f"pipeline exited; log {process.log_path}:\n{process.tail()}"
                    )
                producer.join(0.5)
            time.sleep(5)  # the tail: watermarks catch up after the last event
        finally:
            if broker is not None:
                broker.stop()
        sampler.stop()
        profile.stop()
        peak = process.peak_rss_mb
        by_process = process.peak_rss_by_process_mb
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
        "idle_slack_ms": IDLE_SLACK_MS,
        "driver_read": driver_read,
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
        "over_time": over_time(
            sampler.samples,
            profile.batches.get("#fused", {}),
            broker.samples if broker is not None else None,
            start_ms,
            start_ms + int(seconds * 1000),
        ),
        "traffic_start_ms": start_ms,
        "peak_rss_mb": peak,
        "peak_rss_by_process_mb": by_process,
        "query_restarts": restarts,
    }


def over_time(
    samples: list[dict[str, Any]],
    fused: dict[int, dict[str, Any]],
    broker: list[tuple[int, float]] | None,
    start_ms: int,
    end_ms: int,
) -> dict[str, Any]:
    """Per WINDOW_S of traffic: stage 1's median lag, the driver read's and stage 1's shards'
    p50 over the batches with input, and the broker process's CPU (None when the broker does
    not run on this machine). A lag that grows while the shards' time stays flat and the read's
    grows with the broker's CPU is the broker slowing down (see `_broker_load`)."""
    stage = THREE_STAGES[0]
    busy = [b for b in fused.values() if (b.get("rows") or 0) > 0 and "seen_ms" in b]

    def phase(name: str) -> list[tuple[int, float]]:
        return [
            (int(b["seen_ms"]), float(b["phases"][name]))
            for b in busy
            if isinstance((b.get("phases") or {}).get(name), int | float)
        ]

    lags = [(int(s["t"]), s[stage] / 1000) for s in samples if s.get(stage) is not None]
    return {
        "window_s": WINDOW_S,
        "lag_median_s": per_window(lags, start_ms, end_ms, WINDOW_S, statistics.median),
        "read_p50_s": per_window(phase("read"), start_ms, end_ms, WINDOW_S, statistics.median),
        "shards_p50_s": per_window(
            phase(f"{stage}:shards"), start_ms, end_ms, WINDOW_S, statistics.median
        ),
        "broker_cores": (
            None
            if broker is None
            else per_window(broker, start_ms, end_ms, WINDOW_S, statistics.fmean)
        ),
    }


def profile_line(profile: dict[str, Any]) -> str:
    """The fused batch's seconds (as stage 1 records it: the whole batch) and its phases p50,
    over the batches that took input, in one line."""

    def busy(entry: dict[str, Any]) -> dict[str, Any]:
        return entry.get("with_input") or entry

    own = busy(profile.get("#fused", {}))
    whole = (busy(profile.get(THREE_STAGES[0], {})).get("seconds") or {}).get("p50")
    line = f"batches with input, p50 s: {whole} (whole batch"
    if own.get("phases"):
        line += ": " + ", ".join(f"{k} {v['p50']}" for k, v in own["phases"].items())
    return line + f"; {own.get('batches', 0)} such batches seen)"


OFF_KEY = "millstream_driver_read_off"  # the MILLSTREAM_DRIVER_READ=off run of --driver-read ab


def run(bench: Bench) -> dict[str, Any]:
    """The three-stage pipeline at the first rate, MILLSTREAM_IDLE_SLACK_MS=500 (twice, driver
    read off then on, with --driver-read ab)."""
    rate = bench.rates[0]
    seconds = max(bench.rate_seconds, 20.0) if bench.quick else max(2 * bench.rate_seconds, 30.0)
    runs = {mode: _measure(bench, rate, seconds, mode) for mode in bench.read_modes()}
    found = runs[bench.main_read]
    off = runs.get("off") if bench.driver_read == "ab" else None
    both = len(runs) > 1
    table = print_table(
        f"low watermark lag per stage at {rate:.0f} events/s (after the first {SKIP_S:.0f}s), "
        f"MILLSTREAM_IDLE_SLACK_MS={IDLE_SLACK_MS}, "
        + (
            "MILLSTREAM_DRIVER_READ off (first) and on (second, the judged run)"
            if both
            else f"MILLSTREAM_DRIVER_READ={bench.main_read}"
        ),
        ["stage", "driver read", "samples", "median s", "p95 s", "max s", "batches", "records"],
        [
            [
                s,
                mode,
                run["stages"][s]["samples"],
                run["stages"][s]["median_s"],
                run["stages"][s]["p95_s"],
                run["stages"][s]["max_s"],
                run["batches"][s],
                run["records"][s],
            ]
            for mode, run in runs.items()
            for s in THREE_STAGES
        ],
    )
    memory = ""
    for mode, run in runs.items():
        memory += ("\n" if memory else "") + (f"driver read {mode}: " if both else "")
        memory += (
            f"sent {run['sent']} events; peak RSS {run['peak_rss_mb']} MB; query restarts "
            f"{run['query_restarts']}"
        )
        if not run["caught_up"]:
            memory += "; not caught up 5 s after the traffic"
        memory += "\n  " + profile_line(run["profile"])
        memory += "\n  " + over_time_line(run, THREE_STAGES[0])
        memory += "\n  " + trigger_line(run["spark"])
    print(f"  {memory}\n", flush=True)
    table += "\n" + memory
    png = bench.output / "watermark_lag.png"
    plot(png, found, rate, off)
    result = {
        "scenario": NAME,
        "rate": rate,
        "seconds": seconds,
        "idle_slack_ms": IDLE_SLACK_MS,
        "driver_read": bench.driver_read,
        "millstream": found,
        **({OFF_KEY: off} if off is not None else {}),
        "table": table,
        "plots": [str(png)],
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
