"""Records as users meet them, on real Spark, Redis and Kafka.

An Avro-encoded source with Kafka headers -> `enrich` (reads record.data and record.headers,
produces JSON with headers) -> `collect` (keyed by a field of the JSON, sees the producer's
headers and the decoded data). One value that is not Avro becomes a dead letter naming its
stream, format and position; nothing else is lost or doubled, and no `ms-` header is visible.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import (
    Computation,
    Context,
    Record,
    Topology,
    avro_format,
    json_format,
    kafka_source,
)
from millstream.connectors.formats import encode_with
from tests.e2e.conftest import metric, read_topic, shard_states, wait_until
from tests.e2e.test_bad_input import dead_letter_bodies

pytestmark = pytest.mark.spark

CLICK = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "page", "type": "string"}],
}
CLICKS = 24
BAD_AT = 10  # the offset of the one value that is not Avro (a single partition)


class Enrich(Computation):
    """Per user: passes each click on as JSON keyed by page, with its data-centre header and
    click id as headers of its own."""

    def process_record(self, ctx: Context, record: Record) -> None:
        assert isinstance(record.data, dict), record.data  # decoded, once, by the runtime
        headers = dict(record.headers)
        ctx.produce(
            "views",
            record.data["page"],
            {"user": record.data["user"], "page": record.data["page"]},
            headers=[("dc", headers["dc"]), ("click", headers["click-id"])],
        )
        ctx.set_state(ctx.get_state(0) + 1)
        if any(name.startswith("ms-") for name, _ in record.headers):
            raise AssertionError(f"an ms- header is visible: {record.headers}")


class Collect(Computation):
    """Per page: what each view looked like to a consumer (data and headers)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        seen = ctx.get_state([])
        seen.append(
            {
                "data": record.data,
                "raw_matches": json.loads(record.value) == record.data,
                "headers": [[name, value.decode()] for name, value in record.headers],
            }
        )
        ctx.set_state(seen)


def test_avro_source_with_headers_through_two_stages(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=1)
    click_format = avro_format(CLICK)
    topology = Topology(app_name)
    topology.source(
        "clicks",
        kafka_source(topic, id_header="click-id"),
        max_out_of_order_ms=60_000,
        value_format=click_format,
    )
    topology.stream_format("views", json_format())
    topology.computation("enrich", Enrich(), inputs=["clicks"], outputs=["views"], shards=2)
    topology.computation(
        "collect", Collect(), inputs={"views": json_format().field("page")}, shards=2
    )
    app = start_app(topology)

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    truth: dict[str, list[dict[str, Any]]] = {}
    now = int(time.time() * 1000)
    for i in range(CLICKS + 1):
        user, page, dc = f"u{i % 5}", f"/p{i % 3}", f"dc{i % 2}"
        if i == BAD_AT:
            value = b"\x02"  # a string of length 1 whose byte is missing: not a Click
        else:
            value = encode_with(click_format, {"user": user, "page": page})
            truth.setdefault(page, []).append(
                {
                    "data": {"user": user, "page": page},
                    "raw_matches": True,
                    "headers": [["dc", dc], ["click", f"c{i}"]],
                }
            )
        producer.produce(
            topic,
            key=user,
            value=value,
            headers=[("click-id", f"c{i}".encode()), ("dc", dc.encode()), ("ms-id", b"stray")],
            timestamp=now + i,
        )
    assert producer.flush(10) == 0

    def collected() -> int:
        return sum(len(s) for s in shard_states(redis_client, app_name, "collect", 2).values())

    wait_until(lambda: collected() >= CLICKS, 120, "collect saw every good click", app)
    letters = dead_letter_bodies(
        read_topic(kafka_bootstrap, topology.topic_of("dead-letters"), expected=1)
    )
    time.sleep(2.0)  # let any (wrong) extra effect land before the exact comparisons
    app.check()

    states = shard_states(redis_client, app_name, "collect", 2)
    assert {p: sorted(v, key=json.dumps) for p, v in states.items()} == {
        p: sorted(v, key=json.dumps) for p, v in truth.items()
    }
    assert metric(redis_client, app_name, "enrich", "records") == CLICKS
    assert metric(redis_client, app_name, "enrich", "dead_letters") == 1
    assert metric(redis_client, app_name, "enrich", "user_errors") == 0
    assert metric(redis_client, app_name, "collect", "dead_letters") == 0

    [letter] = letters
    assert letter["error"] == (
        f"value of stream 'clicks' at {topic} partition 0 offset {BAD_AT} does not decode as "
        "avro (schema 'Click'): EOFError: Expected 1 bytes, read 0"
    )
    assert (letter["computation"], letter["stream"], letter["source"]) == (
        "enrich",
        "clicks",
        topic,
    )
    assert (letter["partition"], letter["offset"]) == (0, BAD_AT)
