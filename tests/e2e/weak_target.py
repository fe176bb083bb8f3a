"""A two-stage topology with weak productions (`tests.e2e.weak_target:topology`).

`forward` (keyed by the input's `k`) counts each key and emits one weak production per input,
`{"e": event id, "k": key}`, delivered to the stream's topic before its own commit (MillWheel
6.1.3); `tally` reads that topic as a consumer outside the application would (an injected
source with the productions' `ms-id` as record id) and counts what arrives per key and per
event (a second arrival of an event is recorded under "again"). Inside one fused query weak
productions to a consumer there are handed over after the commit, so reading the topic is
where "delivered before the commit" shows. Configured by the environment: WEAK_TARGET_TOPIC,
MILLSTREAM_APP.
"""

from __future__ import annotations

import json
import os

from millstream import Computation, Context, Record, Topology, json_field, kafka_source

SHARDS = 2


class Forward(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        ctx.set_state(ctx.get_state(0) + 1)
        ctx.produce("forwarded", ctx.key, {"e": body["e"], "k": ctx.key})


class Tally(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        event = json.loads(record.value)["e"]
        state = ctx.get_state({"n": 0, "events": [], "again": []})
        if event in state["events"]:
            state["again"].append(event)
        else:
            state["events"].append(event)
            state["n"] += 1
        ctx.set_state(state)


def topology() -> Topology:
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source(
        "input", kafka_source(os.environ["WEAK_TARGET_TOPIC"], id_header="id"),
        max_out_of_order_ms=10_000,
    )  # fmt: skip
    by_k = json_field("k")
    built.computation(
        "forward", Forward(), inputs={"input": by_k}, outputs=["forwarded"],
        productions="weak", shards=SHARDS,
    )  # fmt: skip
    built.source(
        "forwarded-topic", kafka_source(built.topic_of("forwarded"), id_header="ms-id"),
        max_out_of_order_ms=10_000,
    )  # fmt: skip
    # An outside reader's watermark comes from the topic: after the crash the replayed batch's
    # copies arrive behind it, so they are flagged late and still counted (and deduplicated).
    built.computation(
        "tally", Tally(), inputs={"forwarded-topic": by_k}, shards=SHARDS, late="flag"
    )  # fmt: skip
    return built
