"""The cluster end-to-end test's application (`tests.e2e.cluster_target:topology`).

Two stages, as a user would build them: `tumbling` counts events per key in 1 s event-time
windows (a lifted window operator: its timers close each window once the low watermark passes
its end) and hands each result over the internal stream `counts`; the hand-written `collector`
keeps every window result it receives per key (`"<start>|<end>" -> count`, one received twice
under "again", and the hosts it ran on) and produces it to `out`, which a `KafkaTransactionalSink` delivers to the topic
CLUSTER_TARGET_OUTPUT. Input: CLUSTER_TARGET_INPUT, events `{"e", "k"}` with the id header
`id`. Its shard work runs in executors on the Spark cluster the test starts, so this module is
imported there too (the workers' PYTHONPATH holds the repository).
"""

from __future__ import annotations

import json
import os

from millstream import (
    Computation,
    Context,
    Count,
    Record,
    Topology,
    Tumbling,
    json_field,
    kafka_source,
)

SHARDS = int(os.environ.get("CLUSTER_TARGET_SHARDS", "4"))
WINDOW = Tumbling(1_000)
OUT_OF_ORDER_MS = 1_000


class Collector(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        state = ctx.get_state({"windows": {}, "again": [], "hosts": []})
        name = f"{body['start']}|{body['end']}"
        host = os.environ.get("SPARK_LOCAL_IP", "?")  # the worker's address, in an executor
        if host not in state["hosts"]:
            state["hosts"].append(host)
        if name in state["windows"] or body["update"]:
            state["again"].append(name)
        state["windows"][name] = body["result"]
        ctx.set_state(state)
        ctx.produce("out", ctx.key, {"k": ctx.key, "w": name, "n": body["result"]})


def topology() -> Topology:
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source(
        "events",
        kafka_source(os.environ["CLUSTER_TARGET_INPUT"], id_header="id"),
        max_out_of_order_ms=OUT_OF_ORDER_MS,
    )
    built.window(
        "tumbling",
        stream="events",
        key=json_field("k"),
        window=WINDOW,
        aggregate=Count(),
        output="counts",
        shards=SHARDS,
    )
    built.computation(
        "collector",
        Collector(),
        inputs={"counts": json_field("key")},
        outputs=["out"],
        shards=SHARDS,
    )
    built.sink("out", KafkaTransactionalSink(topic=os.environ["CLUSTER_TARGET_OUTPUT"]))
    return built
