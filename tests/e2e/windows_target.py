"""Every window kind in one application (`tests.e2e.windows_target:topology`), for the
window operators' end-to-end test.

Events `{"e", "k", "n"}` keyed by `k`: `tumbling` counts them per 1 s window, `hopping`
sums `n` over 2 s windows every 1 s, `sessions` counts sessions with a 300 ms gap (all
lifted), and `tumbling_unlifted` is `tumbling` without lifting. A hand-written `collector`
keeps every window result it receives per key (`"<stream>|<start>|<end>" -> result`); one
received twice is recorded under "again", so exactly-once is read from its state.
Configured by WINDOWS_TARGET_TOPIC and MILLSTREAM_APP.
"""

from __future__ import annotations

import json
import os

from millstream import (
    Computation,
    Context,
    Count,
    Hopping,
    Record,
    Session,
    Sum,
    Topology,
    Tumbling,
    json_field,
    kafka_source,
)

SHARDS = 2
OUT_OF_ORDER_MS = 1_000
TUMBLING = Tumbling(1_000)
HOPPING = Hopping(2_000, 1_000)
SESSION = Session(300)


class Collector(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        state = ctx.get_state({"windows": {}, "again": []})
        name = f"{record.stream}|{body['start']}|{body['end']}"
        if name in state["windows"] or body["update"]:
            state["again"].append(name)
        state["windows"][name] = body["result"]
        ctx.set_state(state)


def build(app: str, topic: str) -> Topology:
    topology = Topology(app)
    topology.source(
        "events", kafka_source(topic, id_header="id"), max_out_of_order_ms=OUT_OF_ORDER_MS
    )
    by_k = json_field("k")
    for name, window, aggregate, lift in (
        ("tumbling", TUMBLING, Count(), True),
        ("hopping", HOPPING, Sum("n"), True),
        ("sessions", SESSION, Count(), True),
        ("tumbling_unlifted", TUMBLING, Count(), False),
    ):
        topology.window(
            name, stream="events", key=by_k, window=window, aggregate=aggregate,
            output=f"{name}_out", lift=lift, shards=SHARDS,
        )  # fmt: skip
    topology.computation(
        "collector",
        Collector(),
        inputs={
            s: json_field("key")
            for s in ("tumbling_out", "hopping_out", "sessions_out", "tumbling_unlifted_out")
        },
        shards=SHARDS,
    )
    return topology


def topology() -> Topology:
    return build(os.environ["MILLSTREAM_APP"], os.environ["WINDOWS_TARGET_TOPIC"])
