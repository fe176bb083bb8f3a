"""MillWheel's timestamp contract (section 4.5) and watermark holds, checked in the Context.

A production may not be stamped earlier than its cause (the record, or the timer's output
time) less the allowed skew; a hold must lie between the input low watermark and the timer.
"""

from __future__ import annotations

import pytest

from millstream.connectors.computation import Context
from millstream.connectors.serde import serde_named
from millstream.errors import TimestampContractError
from millstream.records import TimeDomain, Timer

WM = 10_000  # the input low watermark
OUT_WM = 9_000  # the computation's published (output) low watermark, held by older work


def _ctx(timestamp: int, *, cause: str = "the record", skew: int = 0) -> Context:
    return Context(
        "k",
        state=None,
        serde=serde_named("json"),
        low_watermark=WM,
        now=50_000,
        timestamp=timestamp,
        outputs=frozenset({"out"}),
        cause=cause,
        allowed_skew_ms=skew,
        output_watermark=OUT_WM,
    )


def test_default_timestamp_is_the_cause() -> None:
    ctx = _ctx(12_345)
    ctx.produce("out", "k", b"v")
    assert ctx.productions[0].timestamp == 12_345


def test_record_path_accepts_its_own_time_and_later() -> None:
    ctx = _ctx(12_000)
    ctx.produce("out", "k", b"a", 12_000)
    ctx.produce("out", "k", b"b", 99_000)
    assert [p.timestamp for p in ctx.productions] == [12_000, 99_000]


def test_record_path_rejects_earlier_with_a_message_naming_stream_bound_and_fixes() -> None:
    ctx = _ctx(12_000)
    with pytest.raises(TimestampContractError) as info:
        ctx.produce("out", "k", b"v", 11_999)
    text = str(info.value)
    assert "'out'" in text and "11999" in text and "12000" in text
    assert "hold=" in text and "at or after 12000" in text
    assert ctx.productions == []


def test_timer_path_bound_is_the_timer_time() -> None:
    timer = Timer("k", "w", 20_000)
    ctx = _ctx(timer.output_time, cause="timer 'w' at 20000")
    ctx.produce("out", "k", b"ok", 20_000)
    with pytest.raises(TimestampContractError, match="timer 'w' at 20000"):
        ctx.produce("out", "k", b"window start", 19_000)


def test_timer_with_a_hold_may_produce_at_the_hold_and_defaults_to_it() -> None:
    timer = Timer("k", "w", 20_000, TimeDomain.EVENT, hold=19_000)
    assert timer.output_time == 19_000
    ctx = _ctx(timer.output_time)
    ctx.produce("out", "k", b"at hold")
    ctx.produce("out", "k", b"at hold", 19_000)
    assert [p.timestamp for p in ctx.productions] == [19_000, 19_000]
    with pytest.raises(TimestampContractError):
        ctx.produce("out", "k", b"before hold", 18_999)


def test_allowed_skew_relaxes_the_bound_by_exactly_that_much() -> None:
    ctx = _ctx(12_000, skew=500)
    ctx.produce("out", "k", b"v", 11_500)
    with pytest.raises(TimestampContractError):
        ctx.produce("out", "k", b"v", 11_499)


def test_hold_is_buffered_with_the_timer() -> None:
    ctx = _ctx(12_000)
    ctx.set_timer("w", 13_000, hold=12_000)
    ctx.set_timer("plain", 14_000)
    assert ctx.timer_ops == {
        "w": (TimeDomain.EVENT, 13_000, 12_000),
        "plain": (TimeDomain.EVENT, 14_000, None),
    }


def test_hold_behind_the_published_watermark_is_a_contract_error() -> None:
    ctx = _ctx(12_000)
    # Behind the input watermark but not behind what consumers saw: still honoured.
    ctx.set_timer("ok", 13_000, hold=OUT_WM)
    with pytest.raises(TimestampContractError, match="behind this computation's low watermark"):
        ctx.set_timer("w", 13_000, hold=OUT_WM - 1)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"time": 13_000, "hold": 13_001}, ValueError),
        ({"time": 13_000, "hold": 12_000, "domain": "wall"}, ValueError),
        ({"time": 13_000, "hold": 12_000.5}, TypeError),
    ],
)
def test_bad_holds_are_refused(kwargs: dict, error: type[Exception]) -> None:
    ctx = _ctx(12_000)
    with pytest.raises(error):
        ctx.set_timer("w", **kwargs)
    assert ctx.timer_ops == {}
