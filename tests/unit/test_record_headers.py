"""Record headers: produce(headers=) is checked, stored, checkpointed and written after the
`ms-` ones; consumers see them, and never the `ms-` ones, whichever way a record arrived."""

from __future__ import annotations

from typing import Any

import pytest

from millstream.connectors.computation import Context
from millstream.connectors.fresh_records import to_record
from millstream.connectors.plan import TaskInput
from millstream.connectors.serde import JsonSerde
from millstream.connectors.settlement import handed_row as _handed_row
from millstream.headers import (
    HEADER_SYSTEM_TIME,
    encode_time,
    production_headers,
    user_headers,
    visible_headers,
)
from millstream.state.wire import decode_production, encode_production


def _context() -> Context:
    return Context(
        "k",
        state=None,
        serde=JsonSerde(),
        low_watermark=0,
        now=500,
        timestamp=10,
        outputs=frozenset({"out"}),
    )


def test_user_headers_take_a_mapping_or_pairs_and_encode_str_as_utf8() -> None:
    assert user_headers(None) == ()
    assert user_headers({"trace": "é", "raw": b"\x00"}) == (
        ("trace", "é".encode()),
        ("raw", b"\x00"),
    )
    assert user_headers([("a", b"1"), ("a", bytearray(b"2"))]) == (("a", b"1"), ("a", b"2"))


@pytest.mark.parametrize(
    ("headers", "error", "message"),
    [
        ({"ms-id": b"x"}, ValueError, "'ms-id': names starting with 'ms-' are millstream's own"),
        ([("ms-trace", "x")], ValueError, "'ms-trace'"),
        ({"n": 5}, TypeError, "header 'n': value must be bytes or str, got int"),
        ({"n": None}, TypeError, "got NoneType"),
        ([("", b"x")], TypeError, "non-empty str"),
        ([(1, b"x")], TypeError, "non-empty str"),
        (["abc"], TypeError, "expected \\(name, value\\) pairs"),
    ],
)
def test_bad_user_headers_are_refused(headers: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        user_headers(headers)


def test_produce_stores_headers_on_the_production_and_refuses_ms_names() -> None:
    ctx = _context()
    ctx.produce("out", "k", b"v", headers={"trace": "t1"})
    ctx.produce("out", "k", b"v")
    assert [p.headers for p in ctx.productions] == [(("trace", b"t1"),), ()]
    with pytest.raises(ValueError, match="millstream's own"):
        ctx.produce("out", "k", b"v", headers={"ms-event-time": b"0"})
    assert len(ctx.productions) == 2


def test_headers_are_checkpointed_and_written_after_the_ms_ones() -> None:
    ctx = _context()
    ctx.produce("out", "k", b"v", headers=[("trace", b"t1"), ("tenant", b"a")])
    [production] = ctx.productions
    assert decode_production(encode_production(production)).headers == production.headers
    written = production_headers(production)
    assert [name for name, _ in written] == [
        "ms-id",
        "ms-system-time",
        "ms-event-time",
        "trace",
        "tenant",
    ]


def test_visible_headers_drop_ms_ones_and_read_null_values_as_empty() -> None:
    raw = [("ms-id", b"x"), ("trace", bytearray(b"t")), ("empty", None), ("MS-upper", b"u")]
    assert visible_headers(raw) == (("trace", b"t"), ("empty", b""), ("MS-upper", b"u"))
    assert visible_headers(None) == ()


def _internal_row(headers: list[tuple[str, Any]]) -> tuple:
    """A row of an internal stream read from its Kafka topic (queries runtime)."""
    return ("out", b"kafka-id", b"k", b"v", 10, 1, "app.out", 0, 3, headers, None)


def test_a_record_of_an_internal_topic_has_the_producer_headers_only() -> None:
    ctx = _context()
    ctx.produce("out", "k", b"v", headers={"trace": "t1"})
    [production] = ctx.productions
    row = _internal_row(list(production_headers(production)))
    record = to_record(TaskInput("k", row, None), frozenset({"out"}))
    assert record.id == production.id  # the ms- headers still did their work
    assert record.system_time == 500
    assert record.headers == (("trace", b"t1"),)


def test_a_record_handed_over_in_the_fused_batch_has_the_producer_headers() -> None:
    ctx = _context()
    ctx.produce("out", "k", b"v", headers={"trace": "t1"})
    row = _handed_row("producer", 0, ctx.productions[0])
    assert to_record(TaskInput("k", row, None), frozenset({"out"})).headers == (("trace", b"t1"),)


def test_an_injected_record_has_its_kafka_headers_without_ms_ones() -> None:
    row = (
        "events",
        b"id",
        b"k",
        b"v",
        10,
        1,
        "topic",
        0,
        0,
        [("ms-id", b"other"), (HEADER_SYSTEM_TIME, encode_time(5)), ("source", b"dc1")],
        None,
    )
    record = to_record(TaskInput("k", row, None), frozenset())
    assert record.headers == (("source", b"dc1"),)
    assert record.id == b"id"  # an injected stream's id is not taken from a stray ms-id
