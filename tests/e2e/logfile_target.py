"""A log-file pipeline at the injector's default options (`tests.e2e.logfile_target:topology`),
for the rotation end-to-end test.

JSON lines `{"key", "ts", "e"}` from the directory LOGFILE_TARGET_DIR (`*.log`): `counter`
keeps, per key, how many lines it applied; `tumbling` counts them per key and 1 s window (a
lifted window operator); `collector` (the windows test's) keeps every window result it receives
per key as `"windows|<start>|<end>"`, recording one received twice under "again". Exactly-once
and window closure are read from their state.
"""

from __future__ import annotations

import os

from millstream import (
    Computation,
    Context,
    Count,
    Record,
    Topology,
    Tumbling,
    json_field,
    logfile_source,
)
from tests.e2e.windows_target import Collector

SHARDS = 2
WINDOW = Tumbling(1_000)


class Counter(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def topology() -> Topology:
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source("lines", logfile_source(os.environ["LOGFILE_TARGET_DIR"]))
    built.computation("counter", Counter(), inputs=["lines"], shards=SHARDS)
    built.window(
        "tumbling", stream="lines", window=WINDOW, aggregate=Count(), output="windows",
        shards=SHARDS,
    )  # fmt: skip
    built.computation(
        "collector", Collector(), inputs={"windows": json_field("key")}, shards=SHARDS
    )
    return built
