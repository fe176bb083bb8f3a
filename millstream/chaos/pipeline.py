"""The chaos pipeline: two stages joined by an internal stream, output through the transactional sink.

Small on purpose: every input record must leave exactly one output record carrying its id, and
each key's counter must equal the number of distinct ids sent for it. Both are checked against
the input topic itself, never against the pipeline's own metrics.
"""

from __future__ import annotations

import json
from typing import Any

from millstream import Computation, Context, Record, Topology, json_field, kafka_source

ID_HEADER = "rid"


class Router(Computation):
    """Stage 1: forwards each event, keyed by its `k`, to the internal `items` stream."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("items", ctx.key, record.value)


class Counter(Computation):
    """Stage 2: counts events per key and emits one output per event, numbered 1, 2, ... per key."""

    def process_record(self, ctx: Context, record: Record) -> None:
        event = json.loads(record.value)
        count = ctx.get_state(0) + 1
        ctx.set_state(count)
        ctx.produce("counted", ctx.key, {"id": event["id"], "k": ctx.key, "n": count})


def build(config: dict[str, Any]) -> Topology:
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    kafka = {"bootstrap.servers": str(config["bootstrap"])}
    topology = Topology(str(config["app"]))
    # Nothing may be dropped as late: a paused pipeline sees old records long after their time.
    topology.source(
        "events",
        kafka_source(str(config["input_topic"]), id_header=ID_HEADER),
        max_out_of_order_ms=24 * 3600 * 1000,
    )
    shards = int(config["shards"])
    topology.computation(
        "route", Router(), inputs={"events": json_field("k")}, outputs=["items"], shards=shards
    )
    topology.computation("count", Counter(), inputs=["items"], outputs=["counted"], shards=shards)
    # A delivery stuck in librdkafka after a broker outage (send_offsets_to_transaction, see
    # sinks/_shard_producer.py) is given up after this plus a grace: 10 s keeps such a stall
    # (retried, exactly-once either way) from outlasting the faults around it.
    sink = KafkaTransactionalSink(kafka, str(config["output_topic"]), delivery_timeout_s=10.0)
    topology.sink("counted", sink)
    return topology
