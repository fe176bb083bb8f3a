"""`millstream demo`: generate traffic, run the pipeline, crash it once, verify, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from millstream.demo.generator import MAX_DELAY_MS, WINDOW_MS, plan_traffic
from millstream.demo.observe import STAGES, ResultWatcher, WatermarkSampler
from millstream.demo.options import DemoOptions, from_args
from millstream.demo.report import (
    crash_span,
    lag_summary,
    percentiles,
    plot_all,
    split_latency,
    text_report,
    write_json,
)
from millstream.demo.traffic import TrafficPlayer
from millstream.demo.verify import verify
from millstream.settings import Settings
from millstream.state.keys import app_key
from millstream.state.watermarks import WatermarkAuthority, now_ms
from millstream.status import committed_counters, status
from millstream.testing.process import PipelineProcess

INPUT_PARTITIONS = 4


def _batches(client: Any, app: str, stage: str) -> int:
    return int(client.hget(app_key(app, "metrics", stage), "batches") or 0)


def _wait(what: str, condition: Any, timeout: float, pipeline: PipelineProcess) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if not pipeline.alive():
            raise RuntimeError(
                f"the pipeline exited while waiting for {what}; see {pipeline.log_path}"
            )
        time.sleep(0.5)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}; see {pipeline.log_path}"
    )


def main(args: argparse.Namespace) -> int:
    try:
        opts = from_args(args)
    except ValueError as exc:
        print(f"millstream demo: {exc}", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    from millstream.embedded import embedded_services

    with embedded_services(settings) as (redis_url, bootstrap):
        if opts.job == "photon":
            from millstream.demo.photon import run_photon
            from millstream.demo.photon import text_report as photon_report

            summary = run_photon(opts.duration, opts.rate, opts.seed, opts.output, settings,
                                 redis_url, bootstrap)  # fmt: skip
            report = photon_report(summary)
        else:
            summary = run_demo(opts, settings, redis_url, bootstrap)
            report = text_report(summary)
    print(json.dumps(summary, indent=2, default=str) if opts.json else report)
    return 0 if summary["passed"] else 1


def _progress(
    opts: DemoOptions,
    started: float,
    player: TrafficPlayer,
    client: Any,
    app: str,
    sampler: WatermarkSampler,
) -> None:
    metrics = {
        k.decode(): v.decode()
        for k, v in client.hgetall(app_key(app, "metrics", "window_counter")).items()
    }
    late = "/".join(
        str(int(client.hget(app_key(app, "metrics", stage), "late") or 0)) for stage in STAGES
    )
    lags = []
    for stage in STAGES:
        wm = sampler.latest(stage)
        lags.append(
            f"{stage.split('_')[0]} {(now_ms() - wm) / 1000:.1f}s"
            if wm
            else f"{stage.split('_')[0]} -"
        )
    anomalies = int(
        client.hget(app_key(app, "metrics", "spike_detector"), "productions") or 0
    ) + int(client.hget(app_key(app, "metrics", "dip_detector"), "productions") or 0)
    print(
        f"[{time.monotonic() - started:5.0f}s/{opts.duration:.0f}s] sent {player.sent} | "
        f"watermark lag: {', '.join(lags)} | counted {metrics.get('records', 0)}, "
        f"duplicates {metrics.get('duplicates', 0)}, late per stage {late} | anomalies {anomalies}",
        file=sys.stderr,
        flush=True,
    )


def run_demo(
    opts: DemoOptions, settings: Settings, redis_url: str, bootstrap: str
) -> dict[str, Any]:
    from millstream.connectors.topics import ensure_topics
    from millstream.state.client import connect
    from millstream.testing.committed_reader import read_committed_settled as read_settled

    app = f"zeitgeist-{uuid.uuid4().hex[:8]}"
    folder = opts.output / app
    log_dir = folder / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    kafka = {**settings.kafka_extra, "bootstrap.servers": bootstrap}
    topics = {
        "input_topic": f"{app}-queries",
        "window_topic": f"{app}-window-counts",
        "anomaly_topic": f"{app}-anomalies",
    }
    ensure_topics(kafka, {name: INPUT_PARTITIONS for name in topics.values()})
    config = {
        "app": app,
        "bootstrap": bootstrap,
        "log_dir": str(log_dir.resolve()),
        "shards": opts.shards,
        "max_out_of_order_ms": MAX_DELAY_MS + 200,
        **topics,
    }
    config_path = folder / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "MILLSTREAM_APP": app,
        "MILLSTREAM_CHECKPOINT_DIR": str((folder / "checkpoints").resolve()),
        "MILLSTREAM_TRIGGER_MS": os.environ.get("MILLSTREAM_TRIGGER_MS", "300"),
        "MILLSTREAM_LOG_LEVEL": os.environ.get("MILLSTREAM_LOG_LEVEL", "WARNING"),
    }
    client = connect(redis_url)
    pipeline = PipelineProcess(
        [sys.executable, "-m", "millstream.demo.worker", str(config_path)],
        env,
        folder / "pipeline.log",
    )
    plan = plan_traffic(
        duration_s=opts.duration,
        rate=opts.rate,
        duplicates=opts.duplicates,
        late=opts.late,
        seed=opts.seed,
        queries=opts.queries,
    )
    print(
        f"millstream demo: app {app}, {len(plan.events)} sends planned over {opts.duration:.0f}s; "
        f"starting the pipeline (Spark takes a few seconds)",
        file=sys.stderr,
        flush=True,
    )
    faults: list[dict[str, Any]] = []
    sampler = WatermarkSampler(client, app)
    watcher = ResultWatcher(kafka, topics["window_topic"], INPUT_PARTITIONS)
    try:
        pipeline.start()
        _wait(
            "all four computations to run their first batch",
            lambda: all(_batches(client, app, s) > 0 for s in STAGES),
            240,
            pipeline,
        )
        start_wall = now_ms() + 500
        player = TrafficPlayer(plan, start_wall, kafka, topics["input_topic"], log_dir)
        sampler.start()
        watcher.start()
        player.start()
        started = time.monotonic()
        fault_at = opts.duration * 0.4 if opts.fault else None
        last_progress = 0.0
        while player.is_alive():
            elapsed = time.monotonic() - started
            if fault_at is not None and elapsed >= fault_at:
                fault_at = None
                pipeline.kill9()
                killed = now_ms()
                # Read once the old process is gone: a batch it committed on its way out is
                # not the restarted pipeline's progress.
                before = _batches(client, app, "window_counter")
                faults.append(
                    {
                        "type": "SIGKILL pipeline (driver, JVM, workers)",
                        "at_ms": killed,
                        "at_s": (killed - start_wall) / 1000,
                    }
                )
                print(
                    f"millstream demo: SIGKILL of the whole pipeline at +{elapsed:.0f}s; restarting",
                    file=sys.stderr,
                    flush=True,
                )
                pipeline.start()
                _wait(
                    "the restarted pipeline to commit a batch",
                    lambda b=before: _batches(client, app, "window_counter") > b,
                    240,
                    pipeline,
                )
                faults[-1]["recovery_s"] = (now_ms() - killed) / 1000
            if not pipeline.alive():
                raise RuntimeError(f"the pipeline died; see {pipeline.log_path}")
            if elapsed - last_progress >= 5:
                last_progress = elapsed
                _progress(opts, started, player, client, app, sampler)
            time.sleep(0.25)
        if player.error is not None:
            raise RuntimeError(f"traffic generator failed: {player.error}")
        end_wall = start_wall + plan.duration_ms
        authority = WatermarkAuthority(client, app)
        print(
            "millstream demo: traffic done; waiting for every stage's low watermark to pass its end",
            file=sys.stderr,
            flush=True,
        )

        def drained() -> bool:
            marks = [authority.published(s) for s in STAGES]
            return all(m is not None and m.event > end_wall + WINDOW_MS for m in marks)

        _wait("the low watermarks to pass the end of traffic", drained, 180, pipeline)

        def delivered() -> bool:
            # A window count consumed downstream is delivered to the sink at that batch's
            # end, after the consumer's watermark moved: wait for it before reading the sink.
            found = status(client, app)["computations"]
            return all(found.get(s, {}).get("pending_productions", 1) == 0 for s in STAGES)

        _wait("every production delivered to its sink", delivered, 120, pipeline)
        time.sleep(2)  # let the watcher see the last window counts
    finally:
        player_obj = locals().get("player")
        if player_obj is not None:
            player_obj.stop()
        pipeline.stop()
        sampler.stop()
        watcher.stop()

    closed = authority.published("window_counter#input") or authority.published("window_counter")
    if closed is None:  # drained() saw window_counter's watermark: only a wiped Redis gets here
        raise RuntimeError(f"window_counter of {app} has no published watermark in Redis")
    closed_before = closed.event
    window_records = read_settled(bootstrap, topics["window_topic"])
    windows = [r.value for r in window_records if r.value]
    anomalies = [r.value for r in read_settled(bootstrap, topics["anomaly_topic"]) if r.value]
    stages = {stage: committed_counters(client, app, stage, opts.shards) for stage in STAGES}
    counters = stages["window_counter"]
    verdict = verify(plan, start_wall, window_records, anomalies, counters, closed_before, stages)

    window_latency = [
        (seen - (w + WINDOW_MS)) / 1000 for (_, w), seen in watcher.first_seen.items()
    ]
    journeys: list[tuple[int, int]] = []  # (sent, its window count first visible), wall ms
    for event in plan.events:
        if event.kind != "event":
            continue
        wall = start_wall + event.event_ms
        seen = watcher.first_seen.get((event.query, wall - wall % WINDOW_MS))
        if seen is not None:
            journeys.append((start_wall + event.send_ms, seen))
    record_latency = [(seen - sent) / 1000 for sent, seen in journeys]
    span = crash_span(faults, sampler.samples)
    series = _series(plan, start_wall, windows)
    plots = plot_all(folder, record_latency, sampler.samples, start_wall, faults, series)
    summary: dict[str, Any] = {
        "app": app,
        "passed": verdict.passed,
        "options": opts.as_dict(),
        "checks": [c.__dict__ for c in verdict.checks],
        "figures": verdict.figures,
        "counts": {
            "events_sent": plan.counters["events"],
            "duplicates_sent": plan.counters["duplicates"],
            "late_sent": plan.counters["late"],
            "pipeline": counters,
            "stages": {
                stage: {
                    name: values.get(name, 0)
                    for name in ("records", "late", "dead_letters", "duplicates")
                }
                for stage, values in stages.items()
            },
            "window_counts_out": len(windows),
            "anomalies_out": len(anomalies),
        },
        "latency": {
            "record": percentiles(record_latency),
            "window": percentiles(window_latency),
            **split_latency(journeys, span),
            "crash_span_s": None
            if span is None
            else [(span[0] - start_wall) / 1000, (span[1] - start_wall) / 1000],
        },
        "watermark_lag": lag_summary(sampler.samples, start_wall + 10_000),
        "faults": faults,
        "plots": plots,
        "output": str(folder),
    }
    write_json(folder / "summary.json", summary)
    return summary


def _series(
    plan: Any, start_wall: int, windows: list[bytes]
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Observed per-second counts with their moving average, for one spiking and one dipping query."""
    counts: dict[str, dict[int, int]] = {}
    for raw in windows:
        item = json.loads(raw)
        counts.setdefault(item["key"], {})[item["start"]] = item["result"]
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for kind in ("spike", "dip"):
        episode = next((e for e in plan.episodes if e.kind == kind), None)
        if episode is None:
            continue
        query = episode.queries[0]
        by_window = counts.get(query, {})
        observed, model, avg = [], [], 0.0
        for w in range(
            start_wall - start_wall % WINDOW_MS, start_wall + plan.duration_ms, WINDOW_MS
        ):
            n = by_window.get(w, 0)
            t = (w - start_wall) / 1000
            observed.append((t, float(n)))
            model.append((t, avg))
            avg = 0.9 * avg + 0.1 * n
        out[f"{kind}: {query}"] = {"observed": observed, "model (moving average)": model}
    return out
