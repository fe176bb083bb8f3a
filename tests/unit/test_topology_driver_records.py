"""TopologyTestDriver: record headers and value formats with the runtime's semantics."""

from __future__ import annotations

import json
from typing import Any

from millstream import (
    Computation,
    Context,
    Record,
    Topology,
    avro_format,
    json_format,
    kafka_source,
)
from millstream.testing import TopologyTestDriver

CLICK = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "page", "type": "string"}],
}


class Enrich(Computation):
    """Reads a click's data and headers; produces JSON data with a header, keyed by page."""

    def process_record(self, ctx: Context, record: Record) -> None:
        headers = dict(record.headers)
        ctx.produce(
            "views",
            record.data["page"],
            {"user": record.data["user"], "dc": headers["dc"].decode()},
            headers={"dc": headers["dc"], "trace": f"t-{record.data['user']}"},
        )


class Collect(Computation):
    """Keeps what each record looked like: its data and headers."""

    def process_record(self, ctx: Context, record: Record) -> None:
        seen = ctx.get_state([])
        seen.append({"data": record.data, "headers": [[k, v.decode()] for k, v in record.headers]})
        ctx.set_state(seen)


def _topology(enrich: Computation | None = None) -> Topology:
    topology = Topology("t")
    topology.source("clicks", kafka_source("clicks"), value_format=avro_format(CLICK))
    topology.stream_format("views", json_format())
    topology.computation("enrich", enrich or Enrich(), inputs=["clicks"], outputs=["views"])
    topology.computation("collect", Collect(), inputs=["views"])
    return topology


def _letters(driver: TopologyTestDriver) -> list[dict[str, Any]]:
    return [json.loads(p.value) for p in driver.dead_letters()]


def test_headers_and_formats_through_two_stages() -> None:
    driver = TopologyTestDriver(_topology())
    driver.send(
        "clicks",
        {"user": "u1", "page": "/home"},  # encoded with the stream's Avro schema
        key="u1",
        timestamp=5,
        headers={"dc": "eu", "ms-id": b"not the runtime's"},
    )
    [view] = driver.output("views")
    assert json.loads(view.value) == {"dc": "eu", "user": "u1"}
    assert view.headers == (("dc", b"eu"), ("trace", b"t-u1"))
    assert driver.state("collect", "/home") == [
        {"data": {"dc": "eu", "user": "u1"}, "headers": [["dc", "eu"], ["trace", "t-u1"]]}
    ]


def test_an_injected_value_that_does_not_decode_is_a_dead_letter_naming_its_position() -> None:
    driver = TopologyTestDriver(_topology())
    driver.send("clicks", {"user": "u1", "page": "/a"}, key="u1", timestamp=5, headers={"dc": "eu"})
    driver.send("clicks", b"\x02", key="u2", timestamp=6, id="bad")  # truncated Avro
    [letter] = _letters(driver)
    assert letter["error"] == (
        "value of stream 'clicks' at clicks partition 0 offset 1 does not decode as avro "
        "(schema 'Click'): EOFError: Expected 1 bytes, read 0"
    )
    assert (letter["computation"], letter["offset"], letter["record_id"]) == (
        "enrich",
        1,
        b"bad".hex(),
    )
    assert driver.metrics("enrich")["dead_letters"] == 1
    assert driver.metrics("enrich").get("user_errors", 0) == 0  # bad input, not user code
    assert len(driver.output("views")) == 1


class BadHeader(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("views", "k", {"user": "u"}, headers={"ms-id": b"mine"})


class Unencodable(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("views", "k", {"not", "json"})  # a set: JSON cannot hold it


def test_a_reserved_header_or_an_unencodable_value_takes_the_user_error_path() -> None:
    for computation, message in [
        (BadHeader(), "ValueError: header 'ms-id': names starting with 'ms-' are millstream's own"),
        (Unencodable(), "FormatError: produce() to 'views': value does not encode as json: "),
    ]:
        driver = TopologyTestDriver(_topology(computation), user_retries=1)
        driver.send("clicks", {"user": "u1", "page": "/a"}, key="u1", timestamp=5)
        [letter] = _letters(driver)
        assert letter["error"].startswith(message), letter["error"]
        assert driver.metrics("enrich")["user_errors"] == 1
        assert driver.output("views") == []


def test_a_produced_value_that_the_consumer_cannot_decode_is_its_dead_letter() -> None:
    class RawBytes(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            ctx.produce("views", "k", b"{broken")  # bytes are taken as encoded: not checked here

    driver = TopologyTestDriver(_topology(RawBytes()))
    driver.send("clicks", {"user": "u1", "page": "/a"}, key="u1", timestamp=5)
    [letter] = _letters(driver)
    assert letter["computation"] == "collect"
    assert letter["error"].startswith(
        "value of stream 'views' at t.views partition 0 offset 0 does not decode as json"
    )
