"""The pipelines the benchmark runs, built from a JSON config in a pipeline subprocess.

Parts: `window` (a hand-written 1-second window count, `WindowCounter`, into a transactional
Kafka sink), `window_op` and `window_lifted` (the same count as a window declaration,
`Topology.window`, unlifted and lifted), and `passthrough` (one output per input, no window,
into a transactional Kafka sink), several of them reading the same input; or `three_stage`
(the demo's window declaration -> ModelCalculator -> SpikeDetector, for watermark lag).
Every window part writes `{"q", "w", "n"}`-keyed results the bench reads: the hand-written one
directly, the declarations as `{"key", "start", "result"}`.
The computations live in an importable module so Spark's Python workers load them by name.
"""

from __future__ import annotations

import uuid
from typing import Any

from millstream import (
    Computation,
    Context,
    Count,
    Record,
    Timer,
    Topology,
    Tumbling,
    json_field,
    kafka_source,
)
from millstream.demo.pipeline import WINDOW_MS, ModelCalculator, SpikeDetector

THREE_STAGES = ("window_counter", "model_calculator", "spike_detector")


class WindowCounter(Computation):
    """A window count written by hand, as users wrote them before `Topology.window`: one
    state decode and encode and one timer write per record (the bench's comparison)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        window = record.timestamp - record.timestamp % WINDOW_MS
        counts = ctx.get_state({})
        counts[str(window)] = counts.get(str(window), 0) + 1
        ctx.set_state(counts)
        ctx.set_timer(str(window), window + WINDOW_MS)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        count = counts.pop(timer.tag, 0)
        ctx.produce("window_counts", ctx.key, {"q": ctx.key, "w": int(timer.tag), "n": count})
        if counts:
            ctx.set_state(counts)
        else:
            ctx.delete_state()


class PassThrough(Computation):
    """One production per input record, value unchanged (it carries the send time)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.stream, ctx.key, record.value, record.timestamp)


def parts_config(
    bench: Any, prefix: str, parts: list[tuple[str, str, bool]], shards: int = 8
) -> dict[str, Any]:
    """A fresh app reading a fresh input topic, with `parts` (name, what, exactly_once) each
    writing its own fresh output topic: the config `build` takes (`input_topic` and each
    part's `output_topic` included)."""
    from millstream.bench._workload import new_topic

    app = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return {
        "app": app,
        "bootstrap": bench.bootstrap,
        "input_topic": new_topic(bench.kafka, f"{app}-in"),
        "shards": shards,
        "parts": [
            {
                "name": name,
                "what": what,
                "exactly_once": eo,
                "output_topic": new_topic(bench.kafka, f"{app}-{name}"),
            }
            for name, what, eo in parts
        ],
    }


def build(config: dict[str, Any]) -> Topology:
    """`config["parts"]`: computations reading the input stream, each with its output topic.

    A part is `{"name", "what": "window" | "passthrough", "exactly_once", "output_topic"}`;
    `config["kind"] == "three_stage"` builds the watermark pipeline instead.
    """
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    kafka = {"bootstrap.servers": str(config["bootstrap"])}
    shards = int(config["shards"])
    topology = Topology(str(config["app"]))
    topology.source(
        "queries",
        kafka_source(
            str(config["input_topic"]),
            id_header=None if config.get("offset_ids") else "event-id",
        ),
        max_out_of_order_ms=int(config.get("max_out_of_order_ms", 0)),
    )
    by_query = json_field("q")
    if config.get("kind") == "three_stage":
        topology.window(
            "window_counter", stream="queries", key=by_query, window=Tumbling(WINDOW_MS),
            aggregate=Count(), output="window_counts", shards=shards,
        )  # fmt: skip
        stages: list[tuple[str, Computation, Any, str]] = [
            ("model_calculator", ModelCalculator(), ["window_counts"], "model_updates"),
            ("spike_detector", SpikeDetector(), ["model_updates"], "anomalies"),
        ]
        for name, stage, inputs, output in stages:
            topology.computation(name, stage, inputs=inputs, outputs=[output], shards=shards)
        topology.sink("anomalies", KafkaTransactionalSink(kafka, str(config["output_topic"])))
        return topology
    for part in config["parts"]:
        name = str(part["name"])
        computation: Computation
        if part["what"] in ("window_op", "window_lifted"):
            topology.window(
                name, stream="queries", key=by_query, window=Tumbling(WINDOW_MS),
                aggregate=Count(), output="window_counts", shards=shards,
                exactly_once=bool(part["exactly_once"]), lift=part["what"] == "window_lifted",
            )  # fmt: skip
            topology.sink("window_counts", KafkaTransactionalSink(kafka, str(part["output_topic"])))
            continue
        if part["what"] == "passthrough":
            stream = f"{name}_out"
            computation = PassThrough(stream)
        else:
            stream = "window_counts"  # the stream WindowCounter produces
            computation = WindowCounter()
        topology.computation(
            name,
            computation,
            inputs={"queries": by_query},
            outputs=[stream],
            shards=shards,
            exactly_once=bool(part["exactly_once"]),
        )
        topology.sink(stream, KafkaTransactionalSink(kafka, str(part["output_topic"])))
    return topology
