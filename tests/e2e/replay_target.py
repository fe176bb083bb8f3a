"""A pipeline whose computation dead-letters records it cannot read until it is fixed
(`tests.e2e.replay_target:topology`, for tests/e2e/test_dead_letter_replay.py).

Events `{"e": id, "k": key, "v": version}` keyed by `k` (REPLAY_TARGET_TOPIC, ids in the `id`
header). Both computations keep, per key, the list of ids they applied (a repeat would show):

- `reader` raises on version 2 unless the file REPLAY_TARGET_FIX exists (the fix, deployed
  without a restart so the test needs one start less);
- `counter` reads every version: replays of `reader`'s letters must never reach it.
"""

from __future__ import annotations

import json
import os

from millstream import Computation, Context, Record, Topology, json_field, kafka_source

SHARDS = 2


class Reader(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        if body["v"] != 1 and not os.path.exists(os.environ["REPLAY_TARGET_FIX"]):
            raise ValueError(f"unsupported event version {body['v']}")
        ctx.set_state([*ctx.get_state([]), body["e"]])


class Counter(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state([*ctx.get_state([]), json.loads(record.value)["e"]])


def topology() -> Topology:
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source("events", kafka_source(os.environ["REPLAY_TARGET_TOPIC"], id_header="id"))
    by_k = {"events": json_field("k")}
    built.computation("reader", Reader(), inputs=by_k, shards=SHARDS)
    built.computation("counter", Counter(), inputs=by_k, shards=SHARDS)
    return built
