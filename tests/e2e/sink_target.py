"""A topology for the sink fault tests (`millstream run tests.e2e.sink_target:topology`).

One computation, `relay`, keyed by the input's `k`: per input record it counts the key and emits
one production `{"e": event id, "k": key, "n": running count}` to the stream `out`, delivered by
an external sink. Configured by the environment:

- SINK_TARGET_INPUT / SINK_TARGET_OUTPUT: input and output topics;
- SINK_TARGET_MODE: `transactional` (KafkaTransactionalSink) or `idempotent` (KafkaIdempotentSink);
- SINK_TARGET_BOOTSTRAP: the output's broker, given to the sink; unset, the sink is declared
  without Kafka settings (`KafkaTransactionalSink(topic=...)`) and the runtime binds it to the
  application's (KAFKA_BOOTSTRAP_SERVERS);
- SINK_TARGET_TIMEOUT_S: the sink's delivery timeout (default 30);
- SINK_TARGET_JOURNAL: a file where every delivery the sink reports is appended as a JSON line
  (event id, partition, offset the broker acknowledged, or why it was skipped): the evidence for
  telling a record millstream never wrote from one the broker acknowledged and then lost.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.sinks.base import bind_sink

SHARDS = 2


class Relay(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        count = ctx.get_state(0) + 1
        ctx.set_state(count)
        ctx.produce("out", ctx.key, {"e": body["e"], "k": ctx.key, "n": count})


@dataclass
class JournaledSink:
    """Test instrumentation: delegates to `inner` and appends what each delivery reported."""

    inner: Any
    path: str

    @property
    def keeps_shard_producers(self) -> bool:
        """Delivered where the wrapped sink would be: the driver for a transactional sink."""
        return bool(getattr(self.inner, "keeps_shard_producers", False))

    def bind(self, kafka_config: Mapping[str, str]) -> JournaledSink:
        """A wrapper binds what it wraps: the runtime only sees the wrapper."""
        return JournaledSink(bind_sink(self.inner, kafka_config), self.path)

    def setup(self) -> None:
        self.inner.setup()

    def close(self) -> None:
        self.inner.close()

    def deliver(self, shard: Any, productions: Sequence[Any]) -> Any:
        report = self.inner.deliver(shard, productions)
        lines = []
        by_id = {p.id: p for p in productions}
        for delivery in report.deliveries:
            production = by_id[delivery.id]
            entry = {
                "e": json.loads(production.value)["e"],
                "shard": shard.shard,
                "seq": production.seq,
                "partition": delivery.partition,
                "offset": delivery.offset,
                "skipped": delivery.skipped,
                "t": round(time.time(), 3),  # when the delivery returned
            }
            lines.append(json.dumps(entry) + "\n")
        # One write per line, O_APPEND: lines of concurrent workers never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for line in lines:
                os.write(fd, line.encode())
        finally:
            os.close(fd)
        return report


def topology() -> Topology:
    from millstream.sinks.kafka_idempotent import KafkaIdempotentSink
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    bootstrap = os.environ.get("SINK_TARGET_BOOTSTRAP")
    kafka = {"bootstrap.servers": bootstrap} if bootstrap else None
    output = os.environ["SINK_TARGET_OUTPUT"]
    timeout = float(os.environ.get("SINK_TARGET_TIMEOUT_S", "30"))
    mode = os.environ["SINK_TARGET_MODE"]
    if mode == "transactional":
        sink: object = KafkaTransactionalSink(kafka, topic=output, delivery_timeout_s=timeout)
    elif mode == "idempotent":
        sink = KafkaIdempotentSink(kafka, topic=output, delivery_timeout_s=timeout)
    else:
        raise ValueError(f"SINK_TARGET_MODE={mode!r}: expected transactional or idempotent")
    journal = os.environ.get("SINK_TARGET_JOURNAL")
    if journal:
        sink = JournaledSink(sink, journal)
    built = Topology(os.environ["MILLSTREAM_APP"])
    built.source(
        "events",
        kafka_source(os.environ["SINK_TARGET_INPUT"], id_header="eid"),
        max_out_of_order_ms=2000,
    )
    # Late records are flagged and processed, not dropped: after a broker outage the feeder's
    # retried sends carry their first timestamps and can land behind the injector watermark
    # (counted as late either way); these tests are about delivery, not lateness.
    built.computation(
        "relay",
        Relay(),
        inputs={"events": json_field("k")},
        outputs=["out"],
        shards=SHARDS,
        late="flag",
    )
    built.sink("out", sink)
    return built
