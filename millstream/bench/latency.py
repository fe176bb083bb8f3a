"""Scenario 2, latency at fixed input rates (each rate played for a while, one after another).

- Record latency: a pass-through computation (one output per input, no window) delivering
  through the transactional Kafka sink; time from produce (the send time rides in the value)
  to the record being visible to a `read_committed` consumer, as computed live from the raw
  log and its transaction markers (`_marker_watch.py`; Tansu's own read_committed view can
  stall, see there). Exactly-once on and off run as two millstream pipelines, one after the
  other, each one computation (as the floor is one query passing records through).
- Spark's micro-batch floor: a plain Spark query on the same data source and trigger whose
  `foreachBatch` only notes when each record arrives (`plain_spark.py floor`).
- Window latency: window end -> its count visible to a `read_committed` consumer, for the
  millstream WindowCounter (alone in its own pipeline process) and for Quix Streams
  (`quix_app.py`, exactly-once, commit interval = millstream's 200 ms trigger).
- The three millstream pipeline processes (each application one fused query) run first, then
  the floor, then Quix. MILLSTREAM_IDLE_SLACK_MS is the default (`IDLE_SLACK_MS`), stated in
  the result: a caught-up partition's watermark is now minus it, a floor under millstream's
  window latency.

With `--driver-read ab` the three millstream pipeline processes run twice, first with
MILLSTREAM_DRIVER_READ=off (result key `millstream_driver_read_off`), then on (`millstream`),
at the same rates; both are reported, each part's p50 also as a ratio to the floor's.

The first `WARMUP_MS` of every rate phase is left out, and so is each phase's last full
window (it closes only when the next phase's data arrives, for Quix).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millstream.bench._broker_load import (
    CpuSeries,
    broker_line,
    listening_pid,
    per_window,
    phase_figures,
)
from millstream.bench._harness import (
    PROGRESS_FILE,
    BatchProfile,
    Bench,
    Process,
    committed_count,
    metric,
    millstream_pipeline,
    percentiles,
    plain_pipeline,
    print_table,
    quix_pipeline,
    quix_processed,
    redis_int,
    say,
    spark_progress,
    trigger_line,
    write_json,
)
from millstream.bench._marker_watch import MarkerAwareWatcher
from millstream.bench._topologies import parts_config
from millstream.bench._workload import WINDOW_MS, RateProducer, new_topic
from millstream.settings import Settings
from millstream.state.watermarks import WatermarkAuthority

NAME = "latency"
WARMUP_MS = 2000
PAUSE_S = 3.0
DRAIN_S = 150.0
PARTS = ("passthrough_eo", "passthrough_no_eo", "window_counter")
IDLE_SLACK_MS = Settings.idle_slack_ms  # the default, set explicitly so the result states it


@dataclass(frozen=True)
class Phase:
    rate: float
    start_ms: int
    end_ms: int
    sent: int
    # The broker process's mean CPU over the phase, when it runs on this machine: a broker that
    # slows as its partitions grow (the embedded one, `_broker_load`) shows here.
    broker_cores: float | None = None
    # The system's own process tree (driver, JVM, Python workers): CPU microseconds per event
    # sent over the phase, a steadier figure than a latency percentile when comparing two
    # builds on a 2-core machine, where a change's CPU shows in every other process's waits.
    cpu_us_per_event: float | None = None

    def holds_send(self, sent_ms: int) -> bool:
        return self.start_ms + WARMUP_MS <= sent_ms <= self.end_ms

    def holds_window(self, window: int) -> bool:
        return self.start_ms + WARMUP_MS <= window and window + 2 * WINDOW_MS <= self.end_ms


def play(bench: Bench, topic: str, process: Process) -> list[Phase]:
    """Each rate for `bench.rate_seconds`, then a pause so the phases do not overlap."""
    phases = []
    pid = listening_pid(bench.bootstrap)
    broker = CpuSeries(pid) if pid is not None else None
    if broker is not None:
        broker.start()
    try:
        for rate in bench.rates:
            phases.append(_phase(bench, topic, process, rate, broker))
            time.sleep(PAUSE_S)
    finally:
        if broker is not None:
            broker.stop()
    return phases


def _phase(
    bench: Bench, topic: str, process: Process, rate: float, broker: CpuSeries | None
) -> Phase:
    """One rate for `bench.rate_seconds`, with the broker's mean CPU over it when sampled."""
    say(f"{NAME}: {rate:.0f} events/s for {bench.rate_seconds:.0f}s into {topic}")
    producer = RateProducer(bench.kafka, topic, rate, bench.rate_seconds)
    cpu_before = process.cpu_seconds()
    producer.start()
    while producer.is_alive():
        if not process.alive():
            producer.stop()
            raise RuntimeError(f"pipeline exited; log {process.log_path}:\n{process.tail()}")
        producer.join(0.5)
    if producer.error is not None:
        raise RuntimeError(f"rate producer failed: {producer.error}")
    start, end = producer.started_ms, int(time.time() * 1000)
    spent = process.cpu_seconds() - cpu_before
    per_event = round(spent / producer.sent * 1e6, 1) if producer.sent else None
    cores = (
        per_window(broker.samples, start, end, (end - start) / 1000, statistics.fmean)[0]
        if broker is not None and end > start
        else None
    )
    return Phase(rate, start, end, producer.sent, cores, per_event)


def cpu_line(systems: dict[str, list[dict[str, Any]]]) -> str:
    """Each system's own CPU per event during its rate phases, in one line."""
    parts = phase_figures(systems, "cpu_us_per_event", "g")
    return "process tree CPU (us per event sent, each phase): " + ("; ".join(parts) or "-")


def _phase_of(phases: list[Phase], test: str, value: int) -> Phase | None:
    for phase in phases:
        if getattr(phase, test)(value):
            return phase
    return None


class RecordLatency:
    """Collects produce -> visible latencies from values carrying their send time."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, int]] = []  # (sent ms, latency ms)

    def __call__(self, seen: int, key: bytes | None, value: bytes) -> None:
        sent = int(json.loads(value)["sent"])
        self.samples.append((sent, seen - sent))


class WindowLatency:
    """First time each (query, window) count is visible, minus the window's end."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[str, int], int] = {}

    def __call__(self, seen: int, key: bytes | None, value: bytes) -> None:
        item = json.loads(value)
        # A hand-written counter's {"q", "w", "n"}, or a window declaration's result.
        query, start = (item["q"], item["w"]) if "q" in item else (item["key"], item["start"])
        self.first_seen.setdefault((str(query), int(start)), seen)

    def samples(self) -> list[tuple[int, int]]:
        return [(w, seen - (w + WINDOW_MS)) for (_, w), seen in self.first_seen.items()]


def _summary(phases: list[Phase], samples: list[tuple[int, int]], test: str) -> dict[str, Any]:
    by_rate: dict[str, list[float]] = {f"{p.rate:.0f}": [] for p in phases}
    for at, latency in samples:
        phase = _phase_of(phases, test, at)
        if phase is not None:
            by_rate[f"{phase.rate:.0f}"].append(latency / 1000)
    return {rate: percentiles(values) for rate, values in by_rate.items()}


def _warm_up(bench: Bench, topic: str, ready: Any, process: Process, what: str) -> int:
    """A few records through the pipeline, so start-up is not measured as latency.

    `ready(n)` tells whether the pipeline has handled the `n` records sent; returns `n`.
    """
    producer = RateProducer(bench.kafka, topic, 50, 1.0, seed=3)
    producer.start()
    producer.join()
    sent = producer.sent
    process.wait_for(what, lambda: ready(sent), timeout=900)
    time.sleep(PAUSE_S)
    return sent


def _drain(process: Process, what: str, condition: Any) -> bool:
    """Wait up to DRAIN_S for the pipeline to catch up; a pipeline that cannot keep up with the
    rate is reported (`drained: false`, fewer samples), not failed."""
    try:
        process.wait_for(what, condition, timeout=DRAIN_S)
        return True
    except TimeoutError:
        say(f"{NAME}: not caught up {DRAIN_S:.0f}s after the traffic ended ({what})")
        return False


def _missed_by_watchers(found: dict[str, Any]) -> str:
    """Outputs the live watchers never saw although the read at the end found them: they have
    no latency sample."""
    notes = []
    for what in ("records_pipeline", "records_no_eo_pipeline"):
        run = found[what]
        for part, seen in run.get("seen", {}).items():
            read = run.get("committed_reader_count", {}).get(part, seen)
            if seen < read:
                notes.append(f"{part}'s live watcher saw {seen} of them ({read - seen} unsampled)")
    return "; " + ", ".join(notes) if notes else ""


class _Delivered:
    """Whether every output of a part is visible: its live watcher's count, or, once that
    has stood still short of `total` for `RECOUNT_S`, a whole marker-aware read of the topic
    (`committed_count`). The live watcher has missed a whole transaction of a shard's
    outputs on the embedded broker (125 of 180,031 in benchmarks/results/fresh-broker-20261201,
    where the read at the end found every one), and the drain then waited its 150 s for
    outputs that were there."""

    RECOUNT_S = 5.0

    def __init__(
        self, bootstrap: str, outs: dict[str, str], watchers: dict[str, Any], total: int
    ) -> None:
        self.bootstrap = bootstrap
        self.outs = outs
        self.watchers = watchers
        self.total = total
        self._still: dict[str, tuple[int, float]] = {}  # part -> (live count, since)

    def __call__(self, part: str) -> bool:
        live = self.watchers[part].count
        if live >= self.total:
            return True
        now = time.monotonic()
        count, since = self._still.get(part, (-1, now))
        if count != live:
            self._still[part] = (live, now)
            return False
        if now - since < self.RECOUNT_S:
            return False
        self._still[part] = (live, now)  # the next recount after another RECOUNT_S
        return committed_count(self.bootstrap, self.outs[part]) >= self.total


def _pipeline(
    bench: Bench, parts: list[tuple[str, str, bool]], watch: dict[str, Any], driver_read: str
) -> dict[str, Any]:
    """One millstream pipeline process: `parts` (name, what, exactly_once) on one input topic,
    each part's output watched by `watch[name]`, MILLSTREAM_DRIVER_READ=`driver_read`;
    warm-up, the rate phases, drain."""
    config = parts_config(bench, "bl", parts)
    app, topic = config["app"], config["input_topic"]
    outs = {p["name"]: p["output_topic"] for p in config["parts"]}
    folder = bench.run_dir(f"{NAME}-millstream")
    names = [name for name, _, _ in parts]
    passthrough = [name for name, what, _ in parts if what == "passthrough"]
    client = bench.redis()
    profile = BatchProfile(client, app, names)
    say(f"{NAME}: millstream pipeline ({', '.join(names)}), driver read {driver_read}")
    with millstream_pipeline(
        bench, config, folder, idle_slack_ms=IDLE_SLACK_MS, driver_read=driver_read
    ) as process:
        watchers = {n: MarkerAwareWatcher(bench.bootstrap, outs[n], watch[n]) for n in names}
        for watcher in watchers.values():
            watcher.start()
        warm = _warm_up(
            bench,
            topic,
            lambda n: all(metric(client, app, p, "records") >= n for p in names),
            process,
            "the pipeline's first records",
        )
        profile.start()
        phases = play(bench, topic, process)
        total = warm + sum(p.sent for p in phases)
        delivered = _Delivered(bench.bootstrap, outs, watchers, total)
        drained = _drain(
            process,
            "every output delivered and every record counted",
            lambda: (
                all(delivered(p) for p in passthrough)
                and all(metric(client, app, p, "records") >= total for p in names)
            ),
        )
        if any(what == "window" for _, what, _ in parts):
            # Every window of the phases is closed once the low watermark passes their end.
            authority = WatermarkAuthority(client, app)
            drained = drained and _drain(
                process,
                "the window counter's low watermark to pass the last phase",
                lambda: all(
                    (mark := authority.published(p)) is not None and mark.event >= phases[-1].end_ms
                    for p in names
                ),
            )
        time.sleep(2 * PAUSE_S)  # let the last transactions commit and the watchers see them
        profile.stop()
        for watcher in watchers.values():
            watcher.stop()
        peak = process.peak_rss_mb
        by_process = process.peak_rss_by_process_mb
        restarts = process.restarts
    return {
        "app": app,
        "driver_read": driver_read,
        "log": str(process.log_path),
        "profile": profile.summary(),
        "spark": spark_progress(folder / PROGRESS_FILE, f"{app}.", phases[0].start_ms),
        "phases": [p.__dict__ for p in phases],
        "peak_rss_mb": peak,
        "peak_rss_by_process_mb": by_process,
        "query_restarts": restarts,
        "drained": drained,
        "sent": total,
        "counted": {p: metric(client, app, p, "records") for p in names},
        "duplicates_dropped": {p: metric(client, app, p, "duplicates") for p in names},
        "seen": {p: watchers[p].count for p in passthrough},
        # Cross-check with the marker-aware reader (what Apache Kafka's read_committed serves).
        "committed_reader_count": {
            p: committed_count(bench.bootstrap, outs[p]) for p in passthrough
        },
    }


def run_millstream(bench: Bench, driver_read: str) -> dict[str, Any]:
    """Three millstream pipeline processes, one after another, each one computation as the
    floor's query is one pass-through: the pass-through with exactly-once on, the same with
    it off, the window counter (as Quix runs alone); each with MILLSTREAM_DRIVER_READ set to
    `driver_read`. (Until 2026-11-28 both pass-throughs ran in one process, so every batch
    ran two computations against the floor's one.)"""
    eo, no_eo = RecordLatency(), RecordLatency()
    records = _pipeline(bench, [(PARTS[0], "passthrough", True)], {PARTS[0]: eo}, driver_read)
    unguarded = _pipeline(bench, [(PARTS[1], "passthrough", False)], {PARTS[1]: no_eo}, driver_read)
    windows = WindowLatency()
    window = _pipeline(bench, [(PARTS[2], "window", True)], {PARTS[2]: windows}, driver_read)
    phases = [Phase(**p) for p in records["phases"]]
    no_eo_phases = [Phase(**p) for p in unguarded["phases"]]
    window_phases = [Phase(**p) for p in window["phases"]]
    return {
        "driver_read": driver_read,
        "idle_slack_ms": IDLE_SLACK_MS,
        "phases": records["phases"],
        "no_eo_phases": unguarded["phases"],
        "window_phases": window["phases"],
        "record_eo": _summary(phases, eo.samples, "holds_send"),
        "record_no_eo": _summary(no_eo_phases, no_eo.samples, "holds_send"),
        "window": _summary(window_phases, windows.samples(), "holds_window"),
        "raw_record": {PARTS[0]: eo.samples, PARTS[1]: no_eo.samples},
        "raw_window": windows.samples(),
        "records_pipeline": records,
        "records_no_eo_pipeline": unguarded,
        "window_pipeline": window,
        "peak_rss_mb": records["peak_rss_mb"],
        "no_eo_peak_rss_mb": unguarded["peak_rss_mb"],
        "window_peak_rss_mb": window["peak_rss_mb"],
        "query_restarts": sum(p["query_restarts"] for p in (records, unguarded, window)),
        "drained": records["drained"] and unguarded["drained"] and window["drained"],
        "sent": records["sent"],
        "no_eo_sent": unguarded["sent"],
        "committed_reader_count": {
            **records["committed_reader_count"],
            **unguarded["committed_reader_count"],
        },
    }


def run_floor(bench: Bench) -> dict[str, Any]:
    folder = bench.run_dir(f"{NAME}-floor")
    topic = new_topic(bench.kafka, "bench-floor")
    say(f"{NAME}: Spark micro-batch floor (plain foreachBatch, same source and trigger)")
    process, prefix = plain_pipeline(bench, folder, "floor", topic)
    client = bench.redis()
    with process:
        warm = _warm_up(
            bench,
            topic,
            lambda n: redis_int(client, f"{prefix}:records") >= n,
            process,
            "the floor query's first records",
        )
        phases = play(bench, topic, process)
        total = warm + sum(p.sent for p in phases)
        drained = _drain(
            process,
            "every record in foreachBatch",
            lambda: redis_int(client, f"{prefix}:records") >= total,
        )
        peak = process.peak_rss_mb
        by_process = process.peak_rss_by_process_mb
        restarts = process.restarts
    samples = []
    for line in (folder / "latency.txt").read_text().splitlines():
        sent, latency = line.split()
        samples.append((int(sent), int(latency)))
    return {
        "phases": [p.__dict__ for p in phases],
        "record": _summary(phases, samples, "holds_send"),
        "raw": samples,
        "drained": drained,
        "peak_rss_mb": peak,
        "peak_rss_by_process_mb": by_process,
        "query_restarts": restarts,
    }


def run_quix(bench: Bench) -> dict[str, Any]:
    folder = bench.run_dir(f"{NAME}-quix")
    topic = new_topic(bench.kafka, "bench-quix-in")
    out = new_topic(bench.kafka, "bench-quix-out")
    say(f"{NAME}: Quix Streams window count, exactly-once, commit interval 0.2 s")
    process, progress = quix_pipeline(bench, folder, topic, out, commit_interval=0.2)
    windows = WindowLatency()
    with process:
        watcher = MarkerAwareWatcher(bench.bootstrap, out, windows)
        watcher.start()
        warm = _warm_up(
            bench, topic, lambda n: quix_processed(progress) >= n, process, "Quix's first records"
        )
        phases = play(bench, topic, process)
        total = warm + sum(p.sent for p in phases)
        drained = _drain(
            process, "Quix to process everything", lambda: quix_processed(progress) >= total
        )
        time.sleep(2 * PAUSE_S)
        watcher.stop()
        peak = process.peak_rss_mb
        by_process = process.peak_rss_by_process_mb
        restarts = process.restarts
    return {
        "phases": [p.__dict__ for p in phases],
        "window": _summary(phases, windows.samples(), "holds_window"),
        "raw_window": windows.samples(),
        "drained": drained,
        "peak_rss_mb": peak,
        "peak_rss_by_process_mb": by_process,
        "query_restarts": restarts,
    }


def plot(path: Path, curves: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    colors = plt.get_cmap("tab20")
    for index, (label, values) in enumerate(curves.items()):
        if not values:
            continue
        ordered = sorted(values)
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        style = "--" if label.startswith("window") else "-"
        color = colors(index % colors.N)
        ax.plot(ordered, ys, style, label=label, linewidth=1.2, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("latency (s, log scale)")
    ax.set_ylabel("fraction of records / windows")
    ax.set_title("Latency CDF: produce -> visible (records), window end -> visible (windows)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


OFF_KEY = "millstream_driver_read_off"  # the MILLSTREAM_DRIVER_READ=off run of --driver-read ab


def _ratio(value: float | None, floor: float | None) -> float | None:
    return round(value / floor, 3) if value is not None and floor else None


def run(bench: Bench) -> dict[str, Any]:
    # Off first, then on (--driver-read ab); the last is `millstream`, the one judged.
    mills = {mode: run_millstream(bench, mode) for mode in bench.read_modes()}
    mill = mills[bench.main_read]
    off = mills.get("off") if bench.driver_read == "ab" else None
    floor = run_floor(bench)
    quix = run_quix(bench)
    rows = []
    ratios: dict[str, float | None] = {}
    for rate_key in [f"{r:.0f}" for r in bench.rates]:
        floor_p50 = floor["record"][rate_key]["p50"]
        labelled = []
        for mode, found in mills.items():
            read = f", driver read {mode}" if len(mills) > 1 else ""
            labelled += [
                (f"record, millstream exactly-once{read}", found["record_eo"][rate_key]),
                (f"record, millstream exactly_once=False{read}", found["record_no_eo"][rate_key]),
                (f"window end, millstream{read}", found["window"][rate_key]),
            ]
            suffix = "" if mode == bench.main_read else "_driver_read_off"
            for part in ("record_eo", "record_no_eo", "window"):
                ratios[f"{rate_key}/s {part}{suffix} p50 / floor p50"] = _ratio(
                    found[part][rate_key]["p50"], floor_p50
                )
        labelled += [
            ("record, Spark foreachBatch floor", floor["record"][rate_key]),
            ("window end, Quix Streams", quix["window"][rate_key]),
        ]
        for label, stats in labelled:
            rows.append(
                [
                    rate_key,
                    label,
                    stats["n"],
                    stats["p50"],
                    stats["p95"],
                    stats["p99"],
                    _ratio(stats["p50"], floor_p50),
                ]
            )
    reads = (
        "MILLSTREAM_DRIVER_READ off (first) and on (second, the judged run)"
        if off is not None
        else f"MILLSTREAM_DRIVER_READ={bench.main_read}"
    )
    table = print_table(
        "latency (seconds) at fixed input rates; visible = read_committed consumer; "
        f"MILLSTREAM_IDLE_SLACK_MS={IDLE_SLACK_MS}; {reads}",
        ["ev/s", "what", "n", "p50", "p95", "p99", "p50/floor p50"],
        rows,
    )
    memory = ""
    for mode, found in mills.items():
        seen = found["committed_reader_count"]
        memory += (
            ("\n" if memory else "")
            + (f"driver read {mode}: " if len(mills) > 1 else "")
            + f"peak RSS: pass-through exactly-once {found['peak_rss_mb']} MB, "
            f"exactly_once=False {found['no_eo_peak_rss_mb']} MB, "
            f"window counter {found['window_peak_rss_mb']} MB; query restarts "
            f"{found['query_restarts']}; the marker-aware read_committed reader sees "
            f"{seen[PARTS[0]]} outputs of {found['sent']} records sent (exactly-once) and "
            f"{seen[PARTS[1]]} of {found['no_eo_sent']} (exactly_once=False, its own run)"
            + ("" if found["drained"] else "; the pipeline had not caught up")
            + _missed_by_watchers(found)
        )
        for what in ("records_pipeline", "records_no_eo_pipeline", "window_pipeline"):
            label = what.removesuffix("_pipeline").replace("_", " ")
            memory += f"\n{label}: " + trigger_line(found[what]["spark"])
    memory += (
        f"\npeak RSS: Spark floor {floor['peak_rss_mb']} MB, Quix {quix['peak_rss_mb']} MB; "
        f"query restarts: floor {floor['query_restarts']}"
    )
    systems = {
        "millstream exactly-once": mill["phases"],
        "exactly_once=False": mill["no_eo_phases"],
        "window counter": mill["window_phases"],
        "Spark floor": floor["phases"],
        "Quix Streams": quix["phases"],
    }
    memory += "\n" + broker_line(systems) + "\n" + cpu_line(systems)
    print(f"  {memory}\n", flush=True)
    table += "\n" + memory
    curves: dict[str, list[float]] = {}
    for rate in bench.rates:
        for mode, found in mills.items():
            read = f", read {mode}" if len(mills) > 1 else ""
            for name, samples, key in (
                ("millstream EO", found["raw_record"][PARTS[0]], "phases"),
                ("millstream no EO", found["raw_record"][PARTS[1]], "no_eo_phases"),
            ):
                inside = Phase(**next(p for p in found[key] if p["rate"] == rate))
                curves[f"record, {name}{read}, {rate:.0f}/s"] = [
                    lat / 1000 for sent, lat in samples if inside.holds_send(sent)
                ]
        floor_phase = Phase(**next(p for p in floor["phases"] if p["rate"] == rate))
        curves[f"record, Spark floor, {rate:.0f}/s"] = [
            lat / 1000 for sent, lat in floor["raw"] if floor_phase.holds_send(sent)
        ]
        windowed = [
            (f"millstream{f', read {mode}' if len(mills) > 1 else ''}", found, "window_phases")
            for mode, found in mills.items()
        ]
        for name, found, key in [*windowed, ("Quix", quix, "phases")]:
            window_phase = Phase(**next(p for p in found[key] if p["rate"] == rate))
            curves[f"window end, {name}, {rate:.0f}/s"] = [
                lat / 1000 for w, lat in found["raw_window"] if window_phase.holds_window(w)
            ]
    png = bench.output / "latency_cdf.png"
    plot(png, curves)
    for found in mills.values():
        found.pop("raw_record")
        found.pop("raw_window")
    floor.pop("raw")
    quix.pop("raw_window")
    result = {
        "scenario": NAME,
        "rates": bench.rates,
        "seconds_per_rate": bench.rate_seconds,
        "idle_slack_ms": IDLE_SLACK_MS,
        "driver_read": bench.driver_read,
        "millstream": mill,
        **({OFF_KEY: off} if off is not None else {}),
        "spark_floor": floor,
        "quix": quix,
        "ratios": ratios,
        "table": table,
        "plots": [str(png)],
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
