"""Issue #16's targets for the fused runtime, judged on one `millstream bench` run's figures.

`compute(results)` takes the scenario results of the run (`Bench.results`: what each scenario
returned, the same as its JSON file) and gives one entry per target:
`{"name", "measured", "goal", "met", "detail", ...}` for the fused runtime, with the
per-computation queries runtime's value of the same run beside it (`queries`, `queries_met`)
for reference. A target whose scenario was not run (or failed) in that run has `measured` and
`met` null: it is never filled in from another run. Where a target is missed, the entry says by
how much and carries the fused runtime's batch profile of that scenario (`profile`).

Targets (2-core machine, embedded Redis and broker, exactly-once and strong productions on):
- watermarks, three stages at 1,000 events/s with MILLSTREAM_IDLE_SLACK_MS=500: the median lag
  of stage 1 <= 1.8 s, and each further stage adds <= 0.3 s to the median of the one before;
- record latency p50 (exactly-once pass-through) <= 1.2x the Spark foreachBatch floor's p50;
- window end -> count visible p50 <= the floor's p50 + the idle slack the latency run used
  (also reported: the ratio to Quix Streams' p50);
- throughput (exactly-once window count) >= 1.0x Quix Streams exactly-once (2x is the aim);
- peak RSS lower than the queries runtime's in the same scenarios.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping
from typing import Any

RATE = 1000.0  # events/s at which the watermark and latency targets are defined
RATE_KEY = f"{RATE:.0f}"
IDLE_SLACK_MS = 500  # the watermark target's MILLSTREAM_IDLE_SLACK_MS
STAGES = ("window_counter", "model_calculator", "spike_detector")
STAGE_ONE_S = 1.8
PER_STAGE_S = 0.3
RECORD_FLOOR_RATIO = 1.2
THROUGHPUT_RATIO = 1.0
THROUGHPUT_AIM = 2.0

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda measured, goal: measured <= goal,
    ">=": lambda measured, goal: measured >= goal,
    "<": lambda measured, goal: measured < goal,
}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def _entry(
    name: str,
    unit: str,
    comparison: str,
    goal: float | None,
    measured: float | None,
    queries: float | None,
    detail: str,
    **extra: Any,
) -> dict[str, Any]:
    """One target. `met` is null when either side is unknown; a miss says by how much."""
    compare = _COMPARE[comparison]
    met = None if measured is None or goal is None else compare(measured, goal)
    queries_met = None if queries is None or goal is None else compare(queries, goal)
    if met is False and measured is not None and goal is not None:
        miss = abs(measured - goal)
        share = f" (measured = {measured / goal:.2f}x the goal)" if goal else ""
        detail += f" Missed by {miss:.3g} {unit}{share}."
    return {
        "name": name,
        "measured": _round(measured),
        "goal": _round(goal),
        "met": met,
        "unit": unit,
        "comparison": comparison,
        "queries": _round(queries),
        "queries_met": queries_met,
        "detail": detail,
        **extra,
    }


def _absent(name: str, unit: str, comparison: str, goal: float | None, why: str) -> dict[str, Any]:
    return {
        "name": name,
        "measured": None,
        "goal": goal,
        "met": None,
        "unit": unit,
        "comparison": comparison,
        "queries": None,
        "queries_met": None,
        "detail": f"not measured in this run: {why}",
    }


def _why_absent(scenario: str, failed: Collection[str]) -> str:
    if scenario in failed:
        return f"the {scenario} scenario failed"
    return f"the {scenario} scenario was not run (--scenarios)"


def _fused_profile(run: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where a fused pipeline's time went, as a miss's profile: the fused query's own batch
    figures (rows, seconds, phases: read, each computation, deliver_ack) and Spark's trigger
    report (gap between triggers, latestOffset, addBatch = the runtime's batch, walCommit...)."""
    if not run:
        return None
    batches = (run.get("profile") or {}).get("#fused")
    spark = run.get("spark")
    if not batches and not spark:
        return None
    return {"batches": batches, "spark_triggers": spark}


# ------------------------------------------------------------------------------ watermarks

WATERMARK_NAMES = (
    "watermark lag median, stage 1 (window_counter)",
    "watermark lag median added by stage 2 (model_calculator)",
    "watermark lag median added by stage 3 (spike_detector)",
)


def watermark_targets(
    result: Mapping[str, Any] | None, failed: Collection[str] = ()
) -> list[dict[str, Any]]:
    goals = (STAGE_ONE_S, PER_STAGE_S, PER_STAGE_S)
    if result is None:
        why = _why_absent("watermarks", failed)
        return [_absent(n, "s", "<=", g, why) for n, g in zip(WATERMARK_NAMES, goals, strict=True)]
    runs = result.get("runtimes", {})
    rate = float(result.get("rate", 0))
    slack = result.get("idle_slack_ms")
    if rate != RATE or slack != IDLE_SLACK_MS or "fused" not in runs:
        why = (
            f"the watermarks scenario ran at {rate:.0f} events/s with idle slack {slack} ms "
            f"and runtimes {sorted(runs)}; the target is at {RATE:.0f} events/s, "
            f"{IDLE_SLACK_MS} ms, fused"
        )
        return [_absent(n, "s", "<=", g, why) for n, g in zip(WATERMARK_NAMES, goals, strict=True)]

    def medians(runtime: str) -> list[float | None]:
        stages = runs.get(runtime, {}).get("stages", {})
        return [stages.get(s, {}).get("median_s") for s in STAGES]

    def steps(values: list[float | None]) -> list[float | None]:
        out: list[float | None] = [values[0]]
        for before, after in itertools.pairwise(values):
            out.append(None if before is None or after is None else after - before)
        return out

    fused_medians, queries_medians = medians("fused"), medians("queries")
    fused, queries = steps(fused_medians), steps(queries_medians)
    fused_run = runs["fused"]
    context = (
        f"3-stage pipeline at {rate:.0f} events/s, MILLSTREAM_IDLE_SLACK_MS={slack}, delivery "
        f"{result.get('delivery', 'auto')}; medians after the first seconds of traffic, sampled "
        f"once per second. Fused stage medians {_fmt(fused_medians)} s, queries "
        f"{_fmt(queries_medians)} s; fused peak RSS {fused_run.get('peak_rss_mb')} MB, "
        f"query restarts {fused_run.get('query_restarts')}."
    )
    out = []
    for index, (name, goal) in enumerate(zip(WATERMARK_NAMES, goals, strict=True)):
        entry = _entry(name, "s", "<=", goal, fused[index], queries[index], context)
        if entry["met"] is False:
            entry["profile"] = _fused_profile(fused_run)
        if fused[index] is None:
            entry["detail"] = "no lag samples for this stage in the fused run. " + context
        out.append(entry)
    return out


def _fmt(values: list[float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.2f}" for v in values)


# ------------------------------------------------------------------------------ latency

RECORD_NAME = "record latency p50 / Spark foreachBatch floor p50"
WINDOW_NAME = "window end -> count visible p50"


def _stat(found: Mapping[str, Any] | None, key: str, stat: str = "p50") -> float | None:
    if not found:
        return None
    value = found.get(key, {}).get(RATE_KEY, {}).get(stat)
    return None if value is None else float(value)


def latency_targets(
    result: Mapping[str, Any] | None, failed: Collection[str] = ()
) -> list[dict[str, Any]]:
    if result is None:
        why = _why_absent("latency", failed)
        return [
            _absent(RECORD_NAME, "x", "<=", RECORD_FLOOR_RATIO, why),
            _absent(WINDOW_NAME, "s", "<=", None, why),
        ]
    fused = result.get("millstream_fused")
    queries = result.get("millstream")
    floor = result.get("spark_floor")
    quix = result.get("quix")
    if fused is None or floor is None:
        why = "the latency scenario's result has no fused runtime or no Spark floor"
        return [
            _absent(RECORD_NAME, "x", "<=", RECORD_FLOOR_RATIO, why),
            _absent(WINDOW_NAME, "s", "<=", None, why),
        ]
    floor_p50 = _stat(floor, "record")
    if floor_p50 is None:
        why = f"no Spark floor figures at {RATE_KEY} events/s in this run"
        return [
            _absent(RECORD_NAME, "x", "<=", RECORD_FLOOR_RATIO, why),
            _absent(WINDOW_NAME, "s", "<=", None, why),
        ]

    def caught_up(found: Mapping[str, Any] | None) -> str:
        if found is None or found.get("drained", True):
            return ""
        return (
            f" The {found.get('runtime', 'queries')} pipeline had not caught up when the run "
            "ended: its percentiles cover only what became visible."
        )

    fused_record = _stat(fused, "record_eo")
    queries_record = _stat(queries, "record_eo")

    def ratio(value: float | None) -> float | None:
        return None if value is None or not floor_p50 else value / floor_p50

    record = _entry(
        RECORD_NAME,
        "x",
        "<=",
        RECORD_FLOOR_RATIO,
        ratio(fused_record),
        ratio(queries_record),
        f"exactly-once pass-through into the transactional sink, produce -> visible to "
        f"read_committed at {RATE_KEY} events/s: fused p50 {_s(fused_record)}, p95 "
        f"{_s(_stat(fused, 'record_eo', 'p95'))}, p99 {_s(_stat(fused, 'record_eo', 'p99'))}; "
        f"queries p50 {_s(queries_record)}; Spark foreachBatch floor p50 {_s(floor_p50)}."
        + caught_up(fused),
        fused_p50_s=fused_record,
        queries_p50_s=queries_record,
        floor_p50_s=floor_p50,
    )
    if record["met"] is False:
        record["profile"] = _fused_profile(fused.get("records_pipeline"))

    slack_ms = result.get("idle_slack_ms")
    goal = None if slack_ms is None else floor_p50 + float(slack_ms) / 1000
    fused_window = _stat(fused, "window")
    queries_window = _stat(queries, "window")
    quix_window = _stat(quix, "window")

    def to_quix(value: float | None) -> float | None:
        return None if value is None or not quix_window else round(value / quix_window, 3)

    window = _entry(
        WINDOW_NAME,
        "s",
        "<=",
        goal,
        fused_window,
        queries_window,
        f"1-second windows counted exactly-once at {RATE_KEY} events/s, window end -> count "
        f"visible to read_committed: fused p50 {_s(fused_window)}, p99 "
        f"{_s(_stat(fused, 'window', 'p99'))}; queries p50 {_s(queries_window)}; goal = Spark "
        f"floor p50 {_s(floor_p50)} + MILLSTREAM_IDLE_SLACK_MS {slack_ms} ms of the latency "
        f"run; Quix Streams p50 {_s(quix_window)}, fused/Quix {to_quix(fused_window)}."
        + caught_up(fused),
        ratio_to_quix=to_quix(fused_window),
        queries_ratio_to_quix=to_quix(queries_window),
        quix_p50_s=quix_window,
        floor_p50_s=floor_p50,
        idle_slack_ms=slack_ms,
    )
    if goal is None:
        window["detail"] = "the latency result does not state its idle slack. " + window["detail"]
    if window["met"] is False:
        window["profile"] = _fused_profile(fused.get("window_pipeline"))
    return [record, window]


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


# ------------------------------------------------------------------------------ throughput

THROUGHPUT_NAME = "throughput / Quix Streams exactly-once"


def throughput_targets(
    result: Mapping[str, Any] | None, failed: Collection[str] = ()
) -> list[dict[str, Any]]:
    if result is None:
        return [
            _absent(THROUGHPUT_NAME, "x", ">=", THROUGHPUT_RATIO, _why_absent("throughput", failed))
        ]
    by = {r.get("system"): r for r in result.get("runs", [])}
    fused, queries, quix = by.get("millstream-eo-fused"), by.get("millstream-eo"), by.get("quix")
    if fused is None or quix is None:
        return [
            _absent(
                THROUGHPUT_NAME,
                "x",
                ">=",
                THROUGHPUT_RATIO,
                "the throughput result has no millstream-eo-fused or no quix row",
            )
        ]

    def rate(row: Mapping[str, Any] | None) -> float | None:
        value = None if row is None else row.get("events_per_s")
        return None if value is None else float(value)

    theirs = rate(quix)

    def ratio(row: Mapping[str, Any] | None) -> float | None:
        ours = rate(row)
        return None if ours is None or not theirs else ours / theirs

    measured = ratio(fused)
    entry = _entry(
        THROUGHPUT_NAME,
        "x",
        ">=",
        THROUGHPUT_RATIO,
        measured,
        ratio(queries),
        f"{result.get('events')} pre-loaded events counted in 1 s windows, exactly-once, median "
        f"of {len(fused.get('repeats_events_per_s', []))} runs each: fused "
        f"{rate(fused)} events/s (repeats {fused.get('repeats_events_per_s')}), queries "
        f"{rate(queries)}, Quix Streams {theirs} (repeats {quix.get('repeats_events_per_s')}); "
        f"the aim is {THROUGHPUT_AIM}x"
        + (
            f" ({'reached' if measured >= THROUGHPUT_AIM else 'not reached'})."
            if measured is not None
            else "."
        ),
        aim=THROUGHPUT_AIM,
        fused_events_per_s=rate(fused),
        queries_events_per_s=rate(queries),
        quix_events_per_s=theirs,
    )
    if entry["met"] is False:
        entry["profile"] = _fused_profile(fused)  # the median fused run's
    return [entry]


# ------------------------------------------------------------------------------ memory

RSS_NAME = "peak RSS, largest fused pipeline process tree vs the queries runtime's"


def rss_pairs(results: Mapping[str, Any]) -> dict[str, tuple[float | None, float | None]]:
    """(fused, queries) peak RSS in MB of each pipeline this run measured with both runtimes."""
    pairs: dict[str, tuple[float | None, float | None]] = {}
    watermarks = results.get("watermarks")
    if watermarks and "runtimes" in watermarks:
        runs = watermarks["runtimes"]
        pairs["watermarks, 3 stages"] = (
            runs.get("fused", {}).get("peak_rss_mb"),
            runs.get("queries", {}).get("peak_rss_mb"),
        )
    latency = results.get("latency")
    if latency and latency.get("millstream_fused"):
        fused, queries = latency["millstream_fused"], latency.get("millstream", {})
        pairs["latency, 2 pass-throughs"] = (fused.get("peak_rss_mb"), queries.get("peak_rss_mb"))
        pairs["latency, window counter"] = (
            fused.get("window_peak_rss_mb"),
            queries.get("window_peak_rss_mb"),
        )
    throughput = results.get("throughput")
    if throughput:
        by = {r.get("system"): r for r in throughput.get("runs", [])}
        if "millstream-eo-fused" in by:
            pairs["throughput, window counter"] = (
                by["millstream-eo-fused"].get("peak_rss_mb"),
                by.get("millstream-eo", {}).get("peak_rss_mb"),
            )
    return pairs


def rss_target(results: Mapping[str, Any], failed: Collection[str] = ()) -> dict[str, Any]:
    pairs = {k: v for k, v in rss_pairs(results).items() if v[0] and v[1]}
    if not pairs:
        ran = [s for s in ("watermarks", "latency", "throughput") if s in results]
        why = (
            "none of watermarks, latency, throughput ran with both runtimes"
            if not ran
            else f"no peak RSS of both runtimes in {', '.join(ran)}"
        )
        if failed:
            why += f" (failed: {', '.join(sorted(failed))})"
        return _absent(RSS_NAME, "MB", "<", None, why)
    fused = max(float(v[0] or 0) for v in pairs.values())
    queries = max(float(v[1] or 0) for v in pairs.values())
    lower = [k for k, (f, q) in pairs.items() if float(f or 0) < float(q or 0)]
    entry = _entry(
        RSS_NAME,
        "MB",
        "<",
        queries,
        fused,
        queries,
        "summed over each pipeline's process tree (driver, JVM, Python workers), sampled twice "
        "a second; goal = the queries runtime's largest over the same scenarios. Per pipeline "
        "(fused / queries MB): "
        + "; ".join(f"{k} {f} / {q}" for k, (f, q) in pairs.items())
        + f". Fused lower in {len(lower)} of {len(pairs)}."
        + (
            " (Throughput: the queries process ran 3 variants x repeats in one JVM, the fused one"
            " only its own repeats.)"
            if "throughput, window counter" in pairs
            else ""
        ),
        per_pipeline={k: {"fused": f, "queries": q} for k, (f, q) in pairs.items()},
    )
    entry["queries_met"] = None  # the goal is the queries runtime's own figure
    return entry


# ------------------------------------------------------------------------------ all


def compute(results: Mapping[str, Any], failed: Collection[str] = ()) -> list[dict[str, Any]]:
    """Every target, in the issue's order, from one run's scenario results."""
    return [
        *watermark_targets(results.get("watermarks"), failed),
        *latency_targets(results.get("latency"), failed),
        *throughput_targets(results.get("throughput"), failed),
        rss_target(results, failed),
    ]


def table(entries: list[dict[str, Any]]) -> str:
    """The targets as a markdown table (for the results README)."""
    lines = [
        "| target | fused measured | goal | met | queries runtime |",
        "|---|---|---|---|---|",
    ]
    for e in entries:
        met = {True: "yes", False: "**no**", None: "not measured"}[e["met"]]
        goal = "-" if e["goal"] is None else f"{e['comparison']} {e['goal']} {e['unit']}"
        measured = "-" if e["measured"] is None else f"{e['measured']} {e['unit']}"
        queries = "-" if e["queries"] is None else f"{e['queries']} {e['unit']}"
        lines.append(f"| {e['name']} | {measured} | {goal} | {met} | {queries} |")
    return "\n".join(lines)
