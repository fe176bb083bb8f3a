"""Documented per-computation options on the runtime (`tests.e2e.options_target:topology`).

Events `{"e": id, "k": key}` keyed by `k` (OPTIONS_TARGET_TOPIC, ids in the `id` header):

- `raw`, `serde="bytes"`: its state is the raw bytes `e1;e7;...` of the ids it applied;
- `pickled`, `serde="pickle"`: its state is a Python set of those ids;
- `flagged`, `late="flag"`: late records reach it with `record.late` set; its state (JSON)
  counts on-time records and lists the late ones' ids.
"""

from __future__ import annotations

import json
import os

from millstream import Computation, Context, Record, Topology, json_field, kafka_source

SHARDS = 2


class Raw(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(b"") + json.loads(record.value)["e"].encode() + b";")


class Pickled(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(set()) | {json.loads(record.value)["e"]})


class Flagged(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.get_state({"on_time": 0, "late": []})
        if record.late:
            state["late"].append(json.loads(record.value)["e"])
        else:
            state["on_time"] += 1
        ctx.set_state(state)


def topology() -> Topology:
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source("events", kafka_source(os.environ["OPTIONS_TARGET_TOPIC"], id_header="id"))
    by_k = {"events": json_field("k")}
    built.computation("raw", Raw(), inputs=by_k, serde="bytes", shards=SHARDS)
    built.computation("pickled", Pickled(), inputs=by_k, serde="pickle", shards=SHARDS)
    built.computation("flagged", Flagged(), inputs=by_k, late="flag", shards=SHARDS)
    return built
