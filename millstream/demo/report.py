"""The demo's report: a concise text summary, JSON, and PNG plots."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from millstream.demo.observe import STAGES


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99)}


def lag_summary(samples: list[dict[str, Any]], after_ms: int) -> dict[str, dict[str, float | None]]:
    out = {}
    for stage in STAGES:
        lags = [s[stage] / 1000 for s in samples if s.get(stage) is not None and s["t"] >= after_ms]
        out[stage] = {
            "median_s": statistics.median(lags) if lags else None,
            "max_s": max(lags) if lags else None,
        }
    return out


def crash_span(
    faults: list[dict[str, Any]], samples: list[dict[str, Any]], stage: str = "window_counter"
) -> tuple[int, int] | None:
    """The crash and its catch-up, in wall ms: from the first fault until, after the pipeline
    made progress again, `stage`'s low-watermark lag is back within 1 s of its median before
    the fault (the end of the samples if it never is). None without a fault."""
    if not faults:
        return None
    killed = int(faults[0]["at_ms"])
    recovered = killed + int(1000 * faults[0].get("recovery_s", 0.0))
    before = [s[stage] for s in samples if s.get(stage) is not None and s["t"] < killed]
    if not before:
        return killed, recovered
    threshold = statistics.median(before) + 1000
    after = [s for s in samples if s.get(stage) is not None and s["t"] >= recovered]
    back = next((s["t"] for s in after if s[stage] <= threshold), None)
    end = back if back is not None else max((s["t"] for s in after), default=recovered)
    return killed, end


def split_latency(
    journeys: list[tuple[int, int]], span: tuple[int, int] | None
) -> dict[str, dict[str, float | None]]:
    """Event -> window count visible, in s, for events whose journey (sent, seen; wall ms)
    missed the crash span and for those it overlapped."""
    outside: list[float] = []
    inside: list[float] = []
    for sent, seen in journeys:
        crash = span is not None and sent <= span[1] and seen >= span[0]
        (inside if crash else outside).append((seen - sent) / 1000)
    return {"outside_crash": percentiles(outside), "crash_and_catch_up": percentiles(inside)}


def plot_all(
    folder: Path,
    record_latency_s: list[float],
    samples: list[dict[str, Any]],
    start_ms: int,
    faults: list[dict[str, Any]],
    series: dict[str, dict[str, list[tuple[float, float]]]],
) -> list[str]:
    """Write the PNGs; returns their paths. matplotlib comes with the `demo` extra."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(record_latency_s, bins=60, color="#3b6ea5")
    ax.set_xlabel("event produced -> its window count visible to read_committed (s)")
    ax.set_ylabel("events")
    ax.set_title("End-to-end record latency (cf. MillWheel Figure 13)")
    path = folder / "latency_histogram.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))

    fig, ax = plt.subplots(figsize=(8, 4))
    for stage in STAGES:
        points = [
            ((s["t"] - start_ms) / 1000, s[stage] / 1000)
            for s in samples
            if s.get(stage) is not None
        ]
        if points:
            ax.plot(*zip(*points, strict=True), label=stage, linewidth=1.2)
    for fault in faults:
        ax.axvline((fault["at_ms"] - start_ms) / 1000, color="red", linestyle="--", linewidth=1)
    ax.set_xlabel("seconds since traffic start (red: SIGKILL of the pipeline)")
    ax.set_ylabel("low watermark lag (s)")
    ax.set_title("Low watermark lag per stage (cf. MillWheel Figure 15)")
    ax.legend(fontsize=8)
    path = folder / "watermark_lag.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))

    fig, axes = plt.subplots(len(series), 1, figsize=(8, 3 * max(1, len(series))), squeeze=False)
    for ax, (title, lines) in zip(axes[:, 0], series.items(), strict=True):
        for name, points in lines.items():
            if points:
                ax.plot(*zip(*sorted(points), strict=True), label=name, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("seconds since traffic start")
        ax.set_ylabel("events per second")
        ax.legend(fontsize=8)
    path = folder / "counts_vs_model.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))
    return written


def text_report(summary: dict[str, Any]) -> str:
    lines = [f"Zeitgeist demo: {'PASSED' if summary['passed'] else 'FAILED'}"]
    for check in summary["checks"]:
        mark = "ok  " if check["passed"] else "FAIL"
        lines.append(f"  [{mark}] {check['name']}: {check['detail']}")
    for stage, c in summary["counts"].get("stages", {}).items():
        lines.append(
            f"  {stage}: {c['records']} records, {c['late']} late, "
            f"{c['dead_letters']} dead letters, {c['duplicates']} duplicates"
        )
    lat = summary["latency"]
    lines.append(
        "  latency, event -> window count visible: "
        f"p50 {lat['record']['p50']} s, p95 {lat['record']['p95']} s, p99 {lat['record']['p99']} s; "
        f"window end -> visible: p50 {lat['window']['p50']} s, p99 {lat['window']['p99']} s"
    )
    if "outside_crash" in lat:
        out, crash = lat["outside_crash"], lat["crash_and_catch_up"]
        lines.append(
            f"  event -> window count visible outside the crash and its catch-up: p50 "
            f"{out['p50']} s, p99 {out['p99']} s; during them: p50 {crash['p50']} s, "
            f"p99 {crash['p99']} s"
        )
    lag = ", ".join(
        f"{stage} {v['median_s']:.2f}s"
        for stage, v in summary["watermark_lag"].items()
        if v["median_s"] is not None
    )
    lines.append(f"  median low-watermark lag: {lag}")
    for fault in summary["faults"]:
        lines.append(
            f"  fault: {fault['type']} at +{fault['at_s']:.0f}s, pipeline making progress again "
            f"after {fault.get('recovery_s', float('nan')):.1f}s"
        )
    lines.append(f"  plots: {', '.join(summary['plots'])}")
    return "\n".join(lines)


def write_json(path: Path, summary: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str))
