"""The Zeitgeist pipeline, written with millstream's public API as a user would write it.

queries -> window_counter -> window_counts -> model_calculator -> model_updates
        -> spike_detector, dip_detector -> anomalies

`window_counter` is a window declaration: each query's count per 1-second window, produced
once when the low watermark passes the window's end, stamped at that end (MillWheel's Figure
9: no earlier than what caused it, so it is on time downstream), as
`{"key": query, "start", "end", "result": count, "update": false}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from millstream import (
    Computation,
    Context,
    Count,
    Record,
    Source,
    Timer,
    Topology,
    Tumbling,
    json_field,
)

WINDOW_MS = 1000
ALPHA = 0.1  # weight of the newest second in the per-query model
DIP_GAP_MS = 3000  # an active query silent for this long is dipping
SPIKE_COOLDOWN_MS = 30_000


class ModelCalculator(Computation):
    """Keeps a long-lived model per query: a moving average of its per-second count."""

    def process_record(self, ctx: Context, record: Record) -> None:
        count = json.loads(record.value)
        window = {"q": count["key"], "w": count["start"], "n": count["result"]}
        model = ctx.get_state({"avg": 0.0, "seen": 0, "last": None})
        if model["last"] is not None:  # seconds without traffic count as zeros
            silent = max(0, (window["w"] - model["last"]) // WINDOW_MS - 1)
            model["avg"] *= (1 - ALPHA) ** silent
        update = {**window, "expected": round(model["avg"], 3), "seen": model["seen"]}
        ctx.produce("model_updates", ctx.key, update)  # stamped as its window count
        model["avg"] = (1 - ALPHA) * model["avg"] + ALPHA * window["n"]
        model["seen"] += 1
        model["last"] = window["w"]
        ctx.set_state(model)


class SpikeDetector(Computation):
    """A query far above its model is spiking. No timers needed."""

    def process_record(self, ctx: Context, record: Record) -> None:
        u = json.loads(record.value)
        quiet_until = ctx.get_state(0)
        if u["seen"] >= 10 and u["n"] >= max(4 * u["expected"], 12) and u["w"] >= quiet_until:
            ctx.produce("anomalies", ctx.key, {"type": "spike", **u})
            ctx.set_state(u["w"] + SPIKE_COOLDOWN_MS)


class DipDetector(Computation):
    """An active query that goes silent is dipping. Only the low watermark can tell silence from
    data still on its way, so ongoing silence is caught by a low-watermark timer; when traffic
    resumes within one batch of the gap, the gap itself is seen in the data."""

    def process_record(self, ctx: Context, record: Record) -> None:
        u = json.loads(record.value)
        last = ctx.get_state({})
        if last and u["w"] - last["last"] >= DIP_GAP_MS + WINDOW_MS:  # as the timer would
            self._report(ctx, last, record.timestamp)
        if u["seen"] >= 10 and u["expected"] >= 4:
            ctx.set_state({"last": u["w"], "expected": u["expected"], "reported": False})
            ctx.set_timer("dip", u["w"] + WINDOW_MS + DIP_GAP_MS)
        else:
            ctx.delete_state()
            ctx.delete_timer("dip")

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        last = ctx.get_state({})
        if last:
            self._report(ctx, last, timer.time)
            ctx.set_state({**last, "reported": True})

    def _report(self, ctx: Context, last: dict[str, Any], timestamp: int) -> None:
        if last.get("reported"):
            return  # this silence was reported already (by the timer)
        start = last["last"] + WINDOW_MS
        anomaly = {"type": "dip", "q": ctx.key, "w": start, "expected": last["expected"]}
        ctx.produce("anomalies", ctx.key, anomaly, timestamp)


def build(
    app: str, sources: Mapping[str, Source], sinks: Mapping[str, object], shards: int
) -> Topology:
    """Wire the graph; `sources` and `sinks` come from the demo's configuration."""
    topology = Topology(app)
    topology.source("queries", *sources.values())
    by_query = json_field("q")
    topology.window(
        "window_counter",
        stream="queries",
        key=by_query,
        window=Tumbling(WINDOW_MS),
        aggregate=Count(),
        output="window_counts",
        shards=shards,
    )
    topology.computation(
        "model_calculator",
        ModelCalculator(),
        inputs=["window_counts"],
        outputs=["model_updates"],
        shards=shards,
    )
    topology.computation(
        "spike_detector",
        SpikeDetector(),
        inputs=["model_updates"],
        outputs=["anomalies"],
        shards=shards,
    )
    topology.computation(
        "dip_detector",
        DipDetector(),
        inputs=["model_updates"],
        outputs=["anomalies"],
        shards=shards,
    )
    for stream, sink in sinks.items():
        topology.sink(stream, sink)
    return topology
