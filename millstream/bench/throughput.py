"""Scenario 1, throughput: a pre-loaded topic of N events counted in 1-second windows.

The same topic on the same broker is read from the beginning by, one after the other:
millstream with exactly-once on (dedup, strong productions, transactional sink) three ways —
the count as a hand-written `Computation` (`millstream-eo`), as a window declaration
unlifted (`millstream-eo-window`) and lifted (`millstream-eo-lifted`) — millstream with
`exactly_once=False`, Quix Streams 3.28.1 with `processing_guarantee="exactly-once"`, and
a plain Spark `foreachBatch` (one `SET NX` per record id, `HINCRBY` per window count).

Throughput is measured from the first progress each system reports (millstream: the window
counter's `records` metric in Redis becomes non-zero after its first committed batch; Quix:
its first processed message; plain Spark: its first finished batch) until all N events are
committed (millstream, plain Spark: the counter reaches N; Quix: its consumer group's committed
offsets reach N). So start-up (JVM, Spark session, group join) is excluded, and reported apart.
The run goes in `REPEATS` rounds, each one of every system: the millstream variants in one
pipeline process (one Spark session), one after the other, each its own application reading
the topic from the beginning, after a warm-up application has counted a small separate topic
(JVM, Python workers and imports warm for every measured run; each run's start-up is counted
from the end of the previous one); then Quix Streams; then plain Spark. So drift in the
machine's speed over the run reaches every system alike: run one system's repeats after
another's, Quix Streams measured 16.4k ev/s at 56.3 us of CPU a record in one run and 22.8k at
39.8 us in the next, on the same code (benchmarks/results/keyrecords-20261201,
fresh-broker-20261201). Each system is reported by its median run, with every repeat's rate
beside it.

With `--driver-read ab` a third millstream variant, `millstream-eo-read-off` (exactly-once,
MILLSTREAM_DRIVER_READ=off for its run only), is interleaved with the other two; the others
run with it on.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from millstream.bench._harness import (
    PROGRESS_FILE,
    BatchProfile,
    Bench,
    Process,
    committed_offsets,
    metric,
    millstream_pipeline,
    plain_pipeline,
    print_table,
    quix_pipeline,
    quix_processed,
    redis_int,
    say,
    spark_progress,
    write_json,
)
from millstream.bench._workload import new_topic, preload

NAME = "throughput"
READ_OFF = "millstream-eo-read-off"  # the exactly-once variant, MILLSTREAM_DRIVER_READ=off
WINDOW_OP = "millstream-eo-window"  # exactly-once, the window declaration unlifted
LIFTED = "millstream-eo-lifted"  # exactly-once, the window declaration lifted
# The lifted declaration reading the ids the injector derives from each record's position (no
# id header): deduplicated by offset marks, no catalog entry per record. Quix Streams'
# exactly-once keys on offsets too; the other rows read the workload's event-id header.
LIFTED_OFFSETS = "millstream-eo-lifted-offset-ids"
LIFTED_OVERLAPPED = "millstream-eo-lifted-delivery-overlapped"  # MILLSTREAM_OVERLAP_DELIVERY=on
REPEATS = 3  # each system's rate is the median of this many runs (1 with --quick)


def batch_cap(events: int) -> int:
    """Records per micro-batch: about ten batches per run (admission control)."""
    return max(2000, events // 10)


def _follow(
    process: Process, progress: Any, done: Any, events: int, timeout: float, since: float
) -> dict[str, Any]:
    """Sample `progress()` every 0.1 s; rate from the first progress until `done()`, and the
    CPU the process tree spent per record over the same span (issue #24's per-record cost of
    each path: the driver, the JVM and the Python workers; not the broker's or Redis's).

    `since`: when this run began (process start, or the end of the previous run in it).
    """
    first_t: float | None = None
    first_n = 0
    first_cpu = 0.0
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout:.0f}s; log {process.log_path}")
        if not process.alive():
            raise RuntimeError(f"{process.log_path} process exited:\n{process.tail()}")
        n = progress()
        now = time.monotonic()
        if first_t is None and n > 0:
            first_t, first_n, first_cpu = now, n, process.cpu_seconds()
        if done():
            break
        time.sleep(0.1)
    assert first_t is not None
    cpu_s = process.cpu_seconds() - first_cpu
    known = cpu_s >= 0  # below 0 only if the tree's root went away between the samples
    steady_s = max(now - first_t, 1e-3)
    return {
        "events": events,
        "startup_s": round(first_t - since, 2),
        "first_progress_events": first_n,
        "steady_s": round(steady_s, 2),
        "events_per_s": round((events - first_n) / steady_s, 1) if events > first_n else None,
        "wall_s": round(now - since, 2),
        "events_per_s_incl_startup": round(events / (now - since), 1),
        "cpu_s": round(cpu_s, 2) if known else None,
        "cpu_us_per_record": (
            round(cpu_s / (events - first_n) * 1e6, 1) if known and events > first_n else None
        ),
        "cores_busy": round(cpu_s / steady_s, 2) if known else None,
    }


@dataclass(frozen=True)
class Variant:
    label: str
    exactly_once: bool = True
    # The window count as: "window" (a hand-written Computation), "window_op" (a window
    # declaration, unlifted) or "window_lifted" (the declaration with combiner lifting).
    what: str = "window"
    shards: int = 8
    driver_read: str | None = None  # MILLSTREAM_DRIVER_READ of this run; None: the process's
    offset_ids: bool = False  # ids derived from the Kafka position instead of the event-id header
    overlap_delivery: str | None = None  # MILLSTREAM_OVERLAP_DELIVERY of this run; None: default


def run_millstream(
    bench: Bench,
    topic: str,
    events: int,
    variants: list[Variant],
    master: str = "local[2]",
    extra_env: dict[str, str] | None = None,
    label: str | None = None,
) -> list[dict[str, Any]]:
    """The window count over the whole topic, once per variant, one after the other in one
    pipeline process (one Spark session: the JVM starts once); each variant is its own app.
    Each row counts the Redis commands its run took (`INFO stats`, the bench's own Redis: the
    batch-profile poller adds a few per second)."""
    folder = bench.run_dir(f"{NAME}-{label or master}")

    def window_count(source: str, variant: Variant, n: int) -> dict[str, Any]:
        app = f"bt-{uuid.uuid4().hex[:8]}"
        part = {
            "name": "window_counter",
            "what": variant.what,
            "exactly_once": variant.exactly_once,
            "output_topic": new_topic(bench.kafka, f"{app}-out"),
        }
        config = {
            "app": app,
            "bootstrap": bench.bootstrap,
            "input_topic": source,
            "shards": variant.shards,
            "parts": [part],
            "events": n,
            "offset_ids": variant.offset_ids,
        }
        if variant.driver_read is not None:
            config["driver_read"] = variant.driver_read
        if variant.overlap_delivery is not None:
            config["overlap_delivery"] = variant.overlap_delivery
        return config

    warm_events = 2 * batch_cap(events)
    warm = window_count(warmup_topic(bench, warm_events), variants[0], warm_events)
    configs = [window_count(topic, v, events) for v in variants]
    client = bench.redis()
    rows = []
    series = {"app": warm["app"], "runs": [warm, *configs], "events": events}
    with millstream_pipeline(
        bench, series, folder, master=master, max_batch=batch_cap(events), extra=extra_env
    ) as process:
        say(f"{master}: warming up (JVM, Python workers) on {warm_events} other events")
        process.wait_for(
            "the warm-up run",
            lambda: metric(client, str(warm["app"]), "window_counter", "records") >= warm_events,
            timeout=900,
        )
        since = time.monotonic()
        for variant, config in zip(variants, configs, strict=True):
            app = str(config["app"])
            read = variant.driver_read or bench.main_read
            say(
                f"{variant.label}: {events} events, exactly_once={variant.exactly_once}, "
                f"{master}, {variant.shards} shards, driver read {read}"
            )
            profile = BatchProfile(client, app, ["window_counter"])
            commands = redis_commands(client)
            profile.start()
            try:
                result = _follow(
                    process,
                    lambda app=app: metric(client, app, "window_counter", "records"),
                    lambda app=app: metric(client, app, "window_counter", "records") >= events,
                    events,
                    timeout=900,
                    since=since,
                )
            finally:
                profile.stop()
            commands = redis_commands(client) - commands
            since = time.monotonic()
            result.update(
                system=variant.label,
                exactly_once=variant.exactly_once,
                window=variant.what,
                driver_read=read,
                master=master,
                shards=variant.shards,
                profile=profile.summary(),
                log=str(process.log_path),
                batches=metric(client, app, "window_counter", "batches"),
                duplicates_dropped=metric(client, app, "window_counter", "duplicates"),
                catalog_reads=metric(client, app, "window_counter", "catalog_reads"),
                batch_cap=batch_cap(events),
                redis_commands=commands,
                redis_commands_per_record=round(commands / events, 3),
            )
            rows.append(result)
        for row in rows:  # one process ran them all
            row["peak_rss_mb"] = process.peak_rss_mb
            row["peak_rss_by_process_mb"] = process.peak_rss_by_process_mb
            row["query_restarts"] = process.restarts
    for row, config in zip(rows, configs, strict=True):
        row["spark"] = spark_progress(folder / PROGRESS_FILE, f"{config['app']}.")
    return rows


def redis_commands(client: Any) -> int:
    """Commands the bench's Redis has processed so far (summed over a cluster's nodes)."""
    info = client.info("stats")
    if "total_commands_processed" not in info:  # a cluster client: one dict per node
        return sum(int(node["total_commands_processed"]) for node in info.values())
    return int(info["total_commands_processed"])


def warmup_topic(bench: Bench, events: int) -> str:
    """A small topic, loaded once per bench run, that each pipeline process counts first."""
    if bench.warmup is None or bench.warmup[1] < events:
        topic = new_topic(bench.kafka, "bench-warmup")
        preload(bench.kafka, topic, events, seed=5)
        bench.warmup = (topic, events)
    return bench.warmup[0]


def run_quix(bench: Bench, topic: str, events: int, commit_interval: float = 1.0) -> dict[str, Any]:
    folder = bench.run_dir(f"{NAME}-quix")
    out = new_topic(bench.kafka, f"quix-{folder.name}-out")
    say(f"quix: {events} events, exactly-once, commit_interval={commit_interval}s")
    process, progress = quix_pipeline(bench, folder, topic, out, commit_interval)
    group = f"quix-{folder.name}"
    with process:
        result = _follow(
            process,
            lambda: quix_processed(progress),
            lambda: committed_offsets(bench.bootstrap, group, topic) >= events,
            events,
            timeout=900,
            since=process.started,
        )
        result["peak_rss_mb"] = process.peak_rss_mb
        result["peak_rss_by_process_mb"] = process.peak_rss_by_process_mb
        result["query_restarts"] = process.restarts
    result.update(system="quix", exactly_once=True, commit_interval_s=commit_interval)
    return result


def run_plain(bench: Bench, topic: str, events: int) -> dict[str, Any]:
    folder = bench.run_dir(f"{NAME}-plain")
    say(f"plain spark: {events} events, SET NX per record")
    warm = warmup_topic(bench, 2 * batch_cap(events))
    process, prefix = plain_pipeline(
        bench, folder, "count", topic, warmup_topic=warm, max_batch=batch_cap(events)
    )
    client = bench.redis()
    with process:
        result = _follow(
            process,
            lambda: redis_int(client, f"{prefix}:records"),
            lambda: redis_int(client, f"{prefix}:records") >= events,
            events,
            timeout=900,
            since=process.started,
        )
        result["peak_rss_mb"] = process.peak_rss_mb
        result["peak_rss_by_process_mb"] = process.peak_rss_by_process_mb
        result["query_restarts"] = process.restarts
    result.update(
        system="plain-spark",
        exactly_once=False,
        batches=redis_int(client, f"{prefix}:batches"),
        batch_cap=batch_cap(events),
    )
    return result


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (every figure of the row from one real run), plus the
    rates of all repeats: on a shared machine one run can be off by a factor of two."""
    ranked = sorted(runs, key=lambda r: r["events_per_s"] or 0.0)
    return {**ranked[len(ranked) // 2], "repeats_events_per_s": [r["events_per_s"] for r in runs]}


def run(bench: Bench) -> dict[str, Any]:
    events = bench.events
    topic = new_topic(bench.kafka, "bench-throughput")
    say(f"{NAME}: pre-loading {events} events into {topic}")
    load = preload(bench.kafka, topic, events)
    repeats = 1 if bench.quick else REPEATS
    variants = [
        Variant("millstream-eo"),
        Variant(WINDOW_OP, what="window_op"),
        Variant(LIFTED, what="window_lifted"),
        Variant(LIFTED_OFFSETS, what="window_lifted", offset_ids=True),
        Variant(LIFTED_OVERLAPPED, what="window_lifted", overlap_delivery="on"),
        Variant("millstream-no-eo", exactly_once=False),
    ]
    if bench.driver_read == "ab":
        variants.append(Variant(READ_OFF, driver_read="off"))
    # Round by round, every system in each (module doc): drift in the machine's speed over the
    # run reaches them alike.
    runs: list[dict[str, Any]] = []
    quix: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    for _ in range(repeats):
        runs += run_millstream(bench, topic, events, variants)
        quix.append(run_quix(bench, topic, events))
        plain.append(run_plain(bench, topic, events))
    rows = [median_run([r for r in runs if r["system"] == v.label]) for v in variants]
    rows.append(median_run(quix))
    rows.append(median_run(plain))
    by = {r["system"]: r for r in rows}

    def ratio(mine: str, other: str) -> float | None:
        ours, theirs = by[mine]["events_per_s"], by[other]["events_per_s"]
        return round(ours / theirs, 3) if ours and theirs else None

    ratios = {
        "millstream_eo/millstream_no_eo": ratio("millstream-eo", "millstream-no-eo"),
        "millstream_eo/quix": ratio("millstream-eo", "quix"),
        "millstream_eo/plain_spark": ratio("millstream-eo", "plain-spark"),
        "millstream_eo_window/quix": ratio(WINDOW_OP, "quix"),
        "millstream_eo_lifted/quix": ratio(LIFTED, "quix"),
        "millstream_eo_lifted/millstream_eo": ratio(LIFTED, "millstream-eo"),
        "millstream_eo_lifted_offset_ids/quix": ratio(LIFTED_OFFSETS, "quix"),
        "millstream_eo_lifted_delivery_overlapped/millstream_eo_lifted": ratio(
            LIFTED_OVERLAPPED, LIFTED
        ),
    }
    if READ_OFF in by:
        ratios["millstream_eo_read_off/millstream_eo"] = ratio(READ_OFF, "millstream-eo")
        ratios["millstream_eo_read_off/quix"] = ratio(READ_OFF, "quix")
    table = print_table(
        f"throughput: {events:,} events, 1,000 Zipf keys, 4 partitions, 1 s tumbling count; "
        "driver read = MILLSTREAM_DRIVER_READ of the millstream rows",
        [
            "system",
            "window count as",
            "exactly-once",
            "driver read",
            "events/s (median)",
            "repeats",
            "startup s",
            "steady s",
            "CPU us/record",
            "cores busy",
            "peak RSS MB",
            "restarts",
        ],
        [
            [
                r["system"],
                r.get("window", "-"),
                "yes" if r["exactly_once"] else "no",
                r.get("driver_read", "-"),
                r["events_per_s"],
                " / ".join(f"{x:,.0f}" for x in r["repeats_events_per_s"] if x),
                r["startup_s"],
                r["steady_s"],
                r.get("cpu_us_per_record"),
                r.get("cores_busy"),
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
        "input_topic": topic,
        "preload": load,
        "driver_read": bench.driver_read,
        "runs": rows,
        "ratios": ratios,
        "table": table,
    }
    write_json(bench.output / f"{NAME}.json", result)
    return result
