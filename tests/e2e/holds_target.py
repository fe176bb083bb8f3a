"""A two-stage topology for the timestamp-contract tests (`tests.e2e.holds_target:topology`).

`windower` counts each key's events per 1-second window and, when the low watermark passes
the window's end, produces the count stamped at the window's START: the natural timestamp of
a window result, and earlier than the timer that produces it. With HOLDS_TARGET_HOLD=1 the
timer holds the watermark at the window's start (`set_timer(..., hold=start)`), so the result
is on time at `collector`; without it the production breaks the contract and is dead-lettered.

`collector` keeps, per key, every window's count; a window seen twice is recorded under
"again", so exactly-once is checked from its state. Configured by the environment:
HOLDS_TARGET_TOPIC (input topic), HOLDS_TARGET_HOLD ("1" or "0"), MILLSTREAM_APP.
"""

from __future__ import annotations

import json
import os

from millstream import Computation, Context, Record, Timer, Topology, json_field, kafka_source

WINDOW_MS = 1000
SHARDS = 2
OUT_OF_ORDER_MS = 5000


class Windower(Computation):
    def __init__(self, hold: bool) -> None:
        self.hold = hold

    def process_record(self, ctx: Context, record: Record) -> None:
        start = record.timestamp - record.timestamp % WINDOW_MS
        counts = ctx.get_state({})
        counts[str(start)] = counts.get(str(start), 0) + 1
        ctx.set_state(counts)
        ctx.set_timer(str(start), start + WINDOW_MS, hold=start if self.hold else None)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        count = counts.pop(timer.tag, 0)
        start = int(timer.tag)
        ctx.produce("windows", ctx.key, {"k": ctx.key, "w": start, "n": count}, start)
        if counts:
            ctx.set_state(counts)
        else:
            ctx.delete_state()


class Collector(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        state = ctx.get_state({"windows": {}, "again": []})
        if str(body["w"]) in state["windows"]:
            state["again"].append(body["w"])
        state["windows"][str(body["w"])] = body["n"]
        ctx.set_state(state)


def build(app: str, topic: str, hold: bool) -> Topology:
    topology = Topology(app)
    topology.source(
        "events", kafka_source(topic, id_header="id"), max_out_of_order_ms=OUT_OF_ORDER_MS
    )
    topology.computation(
        "windower",
        Windower(hold),
        inputs={"events": json_field("k")},
        outputs=["windows"],
        shards=SHARDS,
    )
    topology.computation(
        "collector", Collector(), inputs={"windows": json_field("k")}, shards=SHARDS
    )
    return topology


def topology() -> Topology:
    return build(
        os.environ["MILLSTREAM_APP"],
        os.environ["HOLDS_TARGET_TOPIC"],
        os.environ.get("HOLDS_TARGET_HOLD", "1") == "1",
    )
