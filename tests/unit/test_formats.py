"""Value formats: JSON and Avro encode and decode, bad values name the format and position."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from millstream import (
    Computation,
    ConfigurationError,
    Context,
    FormatError,
    Record,
    Topology,
    ValueFormat,
    avro_format,
    json_field,
    json_format,
    kafka_source,
)
from millstream.connectors.computation import Context as ContextClass
from millstream.connectors.formats import FieldExtractor, decode_with, encode_with
from millstream.connectors.fresh_records import decode_inputs, to_record
from millstream.connectors.routing import route as _route
from millstream.connectors.serde import JsonSerde

CLICK = {
    "type": "record",
    "name": "Click",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "tag", "type": "string", "default": "none"},
    ],
}


def _row(stream: str, value: bytes, *, offset: int = 7, key: bytes | None = b"k") -> tuple:
    """An injected row (injectors.schema.INJECTED_SCHEMA order) at topic 'clicks', partition 2."""
    return (stream, b"id-%d" % offset, key, value, 1_000, 1_000, "clicks", 2, offset, None, None)


# --- the formats themselves ---------------------------------------------------------------------


def test_json_round_trip_and_compact_sorted_encoding() -> None:
    fmt = json_format()
    data = {"b": [1, 2], "a": "é"}
    encoded = encode_with(fmt, data)
    assert encoded == '{"a":"é","b":[1,2]}'.encode()  # UTF-8, not \u escapes (RFC 8259)
    assert decode_with(fmt, encoded) == data
    assert decode_with(fmt, encode_with(fmt, "text")) == "text"  # a str is a JSON string here


def test_avro_round_trip_with_default_and_pickles() -> None:
    fmt = avro_format(CLICK)
    encoded = encode_with(fmt, {"user": "u1", "n": 3})
    assert decode_with(fmt, encoded) == {"user": "u1", "n": 3, "tag": "none"}
    shipped = pickle.loads(pickle.dumps(fmt))  # formats travel to Spark executors
    assert shipped == fmt
    assert decode_with(shipped, encoded) == {"user": "u1", "n": 3, "tag": "none"}
    assert fmt != avro_format({**CLICK, "name": "Other"})
    assert fmt.describe() == "avro (schema 'Click')"


@pytest.mark.parametrize(
    ("data", "cause"),
    [
        ({"user": "u1"}, "ValueError"),  # n has no default
        ({"user": 1, "n": 2}, "TypeError"),
        ({"user": "u", "n": 1, "extra": 1}, "ValueError"),  # strict: not dropped silently
    ],
)
def test_avro_data_that_does_not_fit_the_schema_does_not_encode(data: Any, cause: str) -> None:
    with pytest.raises(FormatError, match=rf"does not encode as avro \(schema 'Click'\): {cause}"):
        encode_with(avro_format(CLICK), data)


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (b"", "EOFError"),
        (b"\x04u1", "EOFError"),  # truncated: the long is missing
        (b"\x04u1\x06\x02x\xff", "ValueError: 1 bytes left over"),  # written with another schema
        (b'{"user": "u1", "n": 3}', "EOFError"),  # JSON, not Avro
    ],
)
def test_avro_bad_values_do_not_decode(value: bytes, cause: str) -> None:
    with pytest.raises(FormatError, match=rf"does not decode as avro \(schema 'Click'\): {cause}"):
        decode_with(avro_format(CLICK), value)


def test_json_bad_value_does_not_decode() -> None:
    with pytest.raises(FormatError, match="does not decode as json: JSONDecodeError"):
        decode_with(json_format(), b"{not json")
    with pytest.raises(FormatError, match="does not decode as json: UnicodeDecodeError"):
        decode_with(json_format(), b'"\xff"')


def test_an_invalid_avro_schema_fails_at_declaration() -> None:
    with pytest.raises(ValueError, match="invalid Avro schema"):
        avro_format({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})


def test_bytes_are_taken_as_already_encoded() -> None:
    raw = b"\x00\x01 anything"
    assert encode_with(avro_format(CLICK), raw) == raw
    assert encode_with(json_format(), bytearray(raw)) == raw


# --- routing: decoded once, bad values are error rows naming their position ---------------------


class CountingJson(ValueFormat):
    """JSON that counts its decodes, to show a record is decoded once."""

    decodes = 0

    def decode(self, value: bytes) -> Any:
        CountingJson.decodes += 1
        return json.loads(value)

    def encode(self, data: Any) -> bytes:
        return json.dumps(data).encode()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CountingJson)

    def __hash__(self) -> int:
        return 1


def test_route_decodes_once_and_a_field_extractor_of_the_format_reads_the_data() -> None:
    fmt = CountingJson()
    CountingJson.decodes = 0
    rows = [_row("clicks", b'{"user": "u%d"}' % i, offset=i) for i in range(3)]
    routed = [
        item for _, item in _route({"clicks": fmt.field("user")}, 4, iter(rows), {"clicks": fmt})
    ]
    assert CountingJson.decodes == 3
    assert [(i.key, i.data, i.decoded, i.error) for i in routed] == [
        (f"u{i}", {"user": f"u{i}"}, True, None) for i in range(3)
    ]
    # The shard task does not decode them again, and the record carries the data.
    items = decode_inputs([i for i in routed], {"clicks": fmt})
    assert CountingJson.decodes == 3
    assert to_record(items[0], frozenset()).data == {"user": "u0"}


def test_route_without_formats_leaves_decoding_to_the_shard_task() -> None:
    """A router not given the formats (the fused runtime's, until it passes them): the shard
    task decodes, and a bad value becomes an error item with the same reason."""
    fmt = avro_format(CLICK)
    good = _row("clicks", encode_with(fmt, {"user": "u1", "n": 1}), offset=1)
    bad = _row("clicks", b"\x04u1", offset=2)
    routed = [item for _, item in _route({"clicks": lambda k, v: "k"}, 4, iter([good, bad]))]
    assert [i.decoded for i in routed] == [False, False]
    first, second = decode_inputs(routed, {"clicks": fmt})
    assert (first.data, first.decoded, first.error) == (
        {"user": "u1", "n": 1, "tag": "none"},
        True,
        None,
    )
    assert second.error == (
        "value of stream 'clicks' at clicks partition 2 offset 2 does not decode as avro "
        "(schema 'Click'): EOFError: "
    )
    [(_, routed_bad)] = list(_route({"clicks": lambda k, v: "k"}, 4, iter([bad]), {"clicks": fmt}))
    assert routed_bad.error == second.error  # the same reason, wherever it was decoded
    assert routed_bad.key is None


def test_route_keeps_key_extraction_errors_apart_from_format_errors() -> None:
    fmt = json_format()
    rows = [_row("clicks", b'{"other": 1}', offset=3), _row("clicks", b"[1, 2", offset=4)]
    items = [
        item for _, item in _route({"clicks": json_field("user")}, 4, iter(rows), {"clicks": fmt})
    ]
    assert items[0].error == "key extraction failed: KeyError: 'user'"
    assert items[1].error is not None
    assert items[1].error.startswith(
        "value of stream 'clicks' at clicks partition 2 offset 4 does not decode as json: "
        "JSONDecodeError"
    )


def test_a_field_extractor_on_raw_bytes_decodes_them_itself() -> None:
    fmt = avro_format(CLICK)
    extract = fmt.field("user")
    assert isinstance(extract, FieldExtractor)
    assert extract(None, encode_with(fmt, {"user": "u9", "n": 1})) == "u9"


# --- declaring formats --------------------------------------------------------------------------


class Noop(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


def test_computations_get_their_streams_formats_whichever_is_declared_first() -> None:
    topology = Topology("t")
    topology.computation("a", Noop(), inputs=["clicks"], outputs=["out"])
    topology.source("clicks", kafka_source("clicks"), value_format=avro_format(CLICK))
    topology.stream_format("out", json_format())
    topology.computation("b", Noop(), inputs=["out"])
    topology.validate()
    assert dict(topology.computations["a"].formats) == {
        "clicks": avro_format(CLICK),
        "out": json_format(),
    }
    assert dict(topology.computations["b"].formats) == {"out": json_format()}


def test_format_declaration_errors() -> None:
    topology = Topology("t")
    topology.source("clicks", kafka_source("clicks"), value_format=json_format())
    topology.stream_format("clicks", json_format())  # the same again: fine
    with pytest.raises(ConfigurationError, match="already has format json"):
        topology.stream_format("clicks", avro_format(CLICK))
    with pytest.raises(ConfigurationError, match="dead letters are millstream's own JSON"):
        topology.stream_format("dead-letters", json_format())
    with pytest.raises(ConfigurationError, match="expected a value format"):
        topology.stream_format("clicks2", "json")  # type: ignore[arg-type]
    topology.computation("a", Noop(), inputs=["clicks"])
    topology.stream_format("nowhere", json_format())
    with pytest.raises(ConfigurationError, match=r"stream_format\('nowhere'\): no such stream"):
        topology.validate()


# --- producing ----------------------------------------------------------------------------------


def _context(formats: dict[str, ValueFormat]) -> ContextClass:
    return ContextClass(
        "k",
        state=None,
        serde=JsonSerde(),
        low_watermark=0,
        now=0,
        timestamp=10,
        outputs=frozenset({"clicks", "plain"}),
        formats=formats,
    )


def test_produce_encodes_with_the_stream_format() -> None:
    fmt = avro_format(CLICK)
    ctx = _context({"clicks": fmt})
    ctx.produce("clicks", "k", {"user": "u1", "n": 2})
    ctx.produce("clicks", "k", b"\x04u1\x04\x08none")  # bytes: already encoded
    ctx.produce("plain", "k", {"user": "u1"})  # no format: JSON as before
    assert decode_with(fmt, ctx.productions[0].value) == {"user": "u1", "n": 2, "tag": "none"}
    assert ctx.productions[1].value == b"\x04u1\x04\x08none"
    assert ctx.productions[2].value == b'{"user":"u1"}'


def test_produce_of_data_that_does_not_encode_names_the_stream_and_format() -> None:
    ctx = _context({"clicks": avro_format(CLICK)})
    with pytest.raises(
        FormatError,
        match=r"produce\(\) to 'clicks': value does not encode as avro \(schema 'Click'\): "
        r"ValueError: Field n",
    ):
        ctx.produce("clicks", "k", {"user": "u1"})
    assert ctx.productions == []
