"""Scenario 6, steady run: does the pipeline's memory stay flat under constant load?

One millstream pipeline (exactly-once window counter and exactly-once pass-through, both
through the transactional Kafka sink) takes a constant input rate for `--steady-seconds`
(600 by default: the issue's 10-minute run). Every 5 s the benchmark samples the resident
memory of the pipeline's whole process tree, split into the JVM and the Python processes
(driver and Spark's Python workers), and how far the counted records trail the sent ones.

Growth is judged on medians, not single samples (Python workers come and go, the JVM's heap
breathes with garbage collection): the median of the first full minute after warm-up against
the median of the last minute, and the least-squares slope over the second half of the run.
The rate is chosen below the pipeline's capacity on this machine, so a growing backlog does
not pass for a leak; the backlog column shows whether it kept up.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from millstream.bench._harness import (
    Bench,
    metric,
    millstream_pipeline,
    print_table,
    say,
    tree_rss_by_kind,
    write_json,
)
from millstream.bench._topologies import parts_config
from millstream.bench._workload import RateProducer
from millstream.bench.latency import _warm_up

NAME = "steady"
SAMPLE_S = 5.0
PARTS = ("steady_window", "steady_pass")


def _slope_mb_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return None
    return round(60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den, 2)


def summarise(samples: list[dict[str, float]], seconds: float) -> dict[str, Any]:
    """First-minute vs last-minute medians and second-half slope, per kind and in total."""
    out: dict[str, Any] = {}
    for kind in ("total", "java", "python"):
        first = [s[kind] for s in samples if 60 <= s["at"] < 120]
        last = [s[kind] for s in samples if s["at"] >= seconds - 60]
        half = [(s["at"], s[kind]) for s in samples if s["at"] >= seconds / 2]
        out[kind] = {
            "first_minute_median_mb": round(statistics.median(first), 1) if first else None,
            "last_minute_median_mb": round(statistics.median(last), 1) if last else None,
            "growth_mb": round(statistics.median(last) - statistics.median(first), 1)
            if first and last
            else None,
            "second_half_slope_mb_per_min": _slope_mb_per_min(half),
            "peak_mb": round(max(s[kind] for s in samples), 1) if samples else None,
        }
    return out


def plot(path: Path, samples: list[dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [s["at"] / 60 for s in samples]
    for kind in ("total", "java", "python"):
        ax.plot(xs, [s[kind] for s in samples], label=kind, linewidth=1.2)
    ax2 = ax.twinx()
    ax2.plot(xs, [s["backlog"] for s in samples], ":", color="grey", label="backlog (records)")
    ax2.set_ylabel("records sent but not yet counted")
    ax.set_xlabel("minutes of steady input")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_title("Steady run: pipeline memory by process kind")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(bench: Bench) -> dict[str, Any]:
    seconds, rate = bench.steady_seconds, bench.steady_rate
    config = parts_config(
        bench, "bs", [(PARTS[0], "window", True), (PARTS[1], "passthrough", True)]
    )
    app, topic = config["app"], config["input_topic"]
    folder = bench.run_dir(NAME)
    client = bench.redis()
    say(f"{NAME}: {rate:.0f} events/s for {seconds:.0f}s, memory sampled every {SAMPLE_S:.0f}s")
    samples: list[dict[str, float]] = []
    with millstream_pipeline(bench, config, folder) as process:
        assert process.proc is not None
        warm = _warm_up(
            bench,
            topic,
            lambda n: all(metric(client, app, p, "records") >= n for p in PARTS),
            process,
            "the pipeline's first records",
        )
        producer = RateProducer(bench.kafka, topic, rate, seconds, seed=23)
        producer.start()
        began = time.monotonic()
        next_report = began + 60
        while producer.is_alive():
            if not process.alive():
                producer.stop()
                raise RuntimeError(f"pipeline exited; log {process.log_path}:\n{process.tail()}")
            tree = tree_rss_by_kind(process.proc.pid)
            counted = min(metric(client, app, p, "records") for p in PARTS)
            sample = {
                "at": round(time.monotonic() - began, 1),
                "total": round(sum(tree.values()) / 2**20, 1),
                "java": round(tree["java"] / 2**20, 1),
                "python": round(tree["python"] / 2**20, 1),
                "backlog": max(0, warm + producer.sent - counted),
            }
            samples.append(sample)
            if time.monotonic() >= next_report:
                next_report += 60
                say(
                    f"{NAME}: {sample['at']:.0f}s RSS {sample['total']:.0f} MiB (java "
                    f"{sample['java']:.0f}, python {sample['python']:.0f}), backlog "
                    f"{sample['backlog']:.0f}"
                )
            producer.join(SAMPLE_S)
        if producer.error is not None:
            raise RuntimeError(f"rate producer failed: {producer.error}")
        restarts = process.restarts
        sent = warm + producer.sent
    memory = summarise(samples, seconds)
    table = print_table(
        f"steady: {rate:.0f} events/s for {seconds:.0f}s, resident memory (MiB)",
        ["process", "minute 1 median", "last minute median", "growth", "slope 2nd half /min", "peak"],
        [
            [
                kind,
                m["first_minute_median_mb"],
                m["last_minute_median_mb"],
                m["growth_mb"],
                m["second_half_slope_mb_per_min"],
                m["peak_mb"],
            ]
            for kind, m in memory.items()
        ],
    )  # fmt: skip
    backlogs = [s["backlog"] for s in samples]
    print(
        f"  backlog (records sent, not yet counted): median {statistics.median(backlogs):.0f}, "
        f"max {max(backlogs):.0f}; query restarts {restarts}\n",
        flush=True,
    )
    plot(bench.output / "steady_memory.png", samples)
    result = {
        "scenario": NAME,
        "rate": rate,
        "seconds": seconds,
        "sent": sent,
        "memory": memory,
        "backlog_median": statistics.median(backlogs),
        "backlog_max": max(backlogs),
        "query_restarts": restarts,
        "samples": samples,
        "table": table,
        "plots": ["steady_memory.png"],
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
