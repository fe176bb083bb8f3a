"""A topology for `millstream run` tests: per-key counts of a topic named by the environment."""

from __future__ import annotations

import os

from millstream import Computation, Context, Record, Topology, kafka_source

OUT_OF_ORDER_MS = 10_000


class Tally(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def topology() -> Topology:
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source(
        "input",
        kafka_source(os.environ["RUN_TARGET_TOPIC"], id_header="id"),
        max_out_of_order_ms=OUT_OF_ORDER_MS,
    )
    built.computation("tally", Tally(), inputs=["input"])
    return built
