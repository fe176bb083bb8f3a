"""A topology for the sink fault tests (`millstream run tests.e2e.sink_target:topology`).

One computation, `relay`, keyed by the input's `k`: per input record it counts the key and emits
one production `{"e": event id, "k": key, "n": running count}` to the stream `out`, delivered by
an external sink. Configured by the environment:

- SINK_TARGET_INPUT / SINK_TARGET_OUTPUT: input and output topics;
- SINK_TARGET_MODE: `transactional` (KafkaTransactionalSink) or `idempotent` (KafkaIdempotentSink);
- SINK_TARGET_BOOTSTRAP: the output's broker (default: KAFKA_BOOTSTRAP_SERVERS);
- SINK_TARGET_TIMEOUT_S: the sink's delivery timeout (default 30).
"""

from __future__ import annotations

import json
import os

from millstream import Computation, Context, Record, Topology, json_field, kafka_source

SHARDS = 2


class Relay(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        count = ctx.get_state(0) + 1
        ctx.set_state(count)
        ctx.produce("out", ctx.key, {"e": body["e"], "k": ctx.key, "n": count})


def topology() -> Topology:
    from millstream.sinks.kafka_idempotent import KafkaIdempotentSink
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    bootstrap = os.environ.get("SINK_TARGET_BOOTSTRAP") or os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    kafka = {"bootstrap.servers": bootstrap}
    output = os.environ["SINK_TARGET_OUTPUT"]
    timeout = float(os.environ.get("SINK_TARGET_TIMEOUT_S", "30"))
    mode = os.environ["SINK_TARGET_MODE"]
    if mode == "transactional":
        sink: object = KafkaTransactionalSink(kafka, output, delivery_timeout_s=timeout)
    elif mode == "idempotent":
        sink = KafkaIdempotentSink(kafka, output, delivery_timeout_s=timeout)
    else:
        raise ValueError(f"SINK_TARGET_MODE={mode!r}: expected transactional or idempotent")
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source(
        "events",
        kafka_source(os.environ["SINK_TARGET_INPUT"], id_header="eid"),
        max_out_of_order_ms=2000,
    )
    built.computation(
        "relay", Relay(), inputs={"events": json_field("k")}, outputs=["out"], shards=SHARDS
    )
    built.sink("out", sink)
    return built
