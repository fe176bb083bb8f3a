"""A three-stage chain for the fused runtime's fault tests (`add_chain`).

`count` (keyed by the input's `k`) counts each key's events and hands every event on to `relay`,
which hands it on to `collector`; `collector` keeps, per key, the events it saw (a second
arrival is recorded under "again"), so exactly-once is checked from its state. Everything runs
in one fused query: both hand-overs happen inside each micro-batch. `tests/e2e/fused_target.py`
adds the chain to a topology beside `tests/e2e/holds_target.py`'s windows.
"""

from __future__ import annotations

import json

from millstream import Computation, Context, Record, Topology, json_field, kafka_source

SHARDS = 2


class Count(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)
        ctx.produce("counted", ctx.key, record.value)


class Relay(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("relayed", ctx.key, record.value)


class Collector(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        event = json.loads(record.value)["e"]
        state = ctx.get_state({"events": [], "again": []})
        if event in state["events"]:
            state["again"].append(event)
        else:
            state["events"].append(event)
        ctx.set_state(state)


def add_chain(
    topology: Topology, topic: str, collector: str = "collector", id_header: str | None = "id"
) -> Topology:
    """Source `input` (topic, ids in the `id_header` header; None: each record's id is its
    position, deduplicated by offset marks) -> count -> relay -> `collector`."""
    topology.source(
        "input", kafka_source(topic, id_header=id_header), max_out_of_order_ms=10_000
    )  # fmt: skip
    by_k = json_field("k")
    topology.computation(
        "count", Count(), inputs={"input": by_k}, outputs=["counted"], shards=SHARDS
    )  # fmt: skip
    topology.computation(
        "relay", Relay(), inputs={"counted": by_k}, outputs=["relayed"], shards=SHARDS
    )  # fmt: skip
    topology.computation(collector, Collector(), inputs={"relayed": by_k}, shards=SHARDS)
    return topology
