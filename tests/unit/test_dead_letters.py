"""Dead letters as `millstream dead-letters` reads them: what a letter gives back for a replay.

A letter's record must come back byte for byte: UTF-8 values and keys as text, anything else
also as base64; user headers carried; timer letters and truncated values refused with a reason.
"""

from __future__ import annotations

import json

from millstream.connectors.key_runner import DEAD_LETTER_VALUE_BYTES, dead_letter
from millstream.connectors.plan import BatchPlan
from millstream.connectors.topology import ComputationSpec, Topology
from millstream.dead_letters import Letter, choose, render
from millstream.state.replay import Replay, replay_id
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import NONE_KNOWN


def _spec() -> ComputationSpec:
    from millstream import Computation, json_field, kafka_source

    class Noop(Computation):
        def process_record(self, ctx: object, record: object) -> None:
            pass

    topology = Topology("dl")
    topology.source("events", kafka_source("t"))
    topology.computation("c", Noop(), inputs={"events": json_field("k")})
    return topology.computations["c"]


def _plan() -> BatchPlan:
    return BatchPlan(
        app="dl", batch_id=1, redis_url="redis://x", shards=1, shard_config=ShardConfig(),
        input_watermark=NONE_KNOWN, gc_watermark=0, now=1_000, user_retries=0,
        fail_stop=False, internal_inputs=frozenset(), deliveries={},
        in_flight_streams=frozenset(),
    )  # fmt: skip


def _letter(key: bytes | None, value: bytes, headers: list | None = None) -> Letter:
    row = ("events", b"\x01" * 16, key, value, 900, 950, "t", 0, 7, headers, None)
    production = dead_letter(_plan(), _spec(), "k1", "ValueError: boom", row)
    return Letter(production.id, 0, 0, json.loads(production.value))


def test_a_utf8_record_comes_back_exactly_from_its_letter() -> None:
    letter = _letter(b"k1", '{"k": "k1", "x": "é"}'.encode(), [("trace", b"abc"), ("ms-id", b"z")])
    assert letter.not_replayable() is None
    back = letter.to_replay(restamp=False)
    assert (back.key, back.value, back.timestamp, back.stream) == (
        b"k1", '{"k": "k1", "x": "é"}'.encode(), 900, "events",
    )  # fmt: skip
    assert back.headers == (("trace", b"abc"),)  # millstream's own headers are not user data
    assert back.computation == "c" and back.id == replay_id(letter.id) != letter.id
    assert letter.to_replay(restamp=True).timestamp is None  # stamped when applied


def test_binary_values_and_keys_come_back_byte_for_byte() -> None:
    raw = bytes(range(256))
    letter = _letter(b"\xff\xfe", raw)
    assert "\\x" in letter.body["value"]  # still readable in the listing
    back = letter.to_replay(restamp=False)
    assert (back.key, back.value) == (b"\xff\xfe", raw)


def test_truncated_values_and_timer_letters_are_not_replayable() -> None:
    big = _letter(None, b"x" * (DEAD_LETTER_VALUE_BYTES + 1))
    assert "16 KiB" in (big.not_replayable() or "")
    timer = Letter(b"t", 0, 1, {"computation": "c", "error": "boom", "timer": {"tag": "w"}})
    assert "timer" in (timer.not_replayable() or "")


def test_a_replay_survives_the_queue_encoding() -> None:
    item = Replay(b"L", "c", "events", None, b"\x00v", None, (("h", b"\x01"),))
    fields = {k.encode(): v for k, v in item.fields().items()}
    assert Replay.from_fields(fields) == item


def test_choose_and_render_count_per_computation_and_reason() -> None:
    letters = [_letter(b"k1", b"{}") for _ in range(3)]
    letters.append(Letter(b"o", 0, 9, {"computation": "other", "error": "late", "key": "k9"}))
    assert len(choose(letters, computation="c")) == 3
    assert len(choose(letters, reason="late")) == 1
    text = render(letters, limit=2)
    assert text.splitlines()[:3] == [
        "4 dead letters", "        3  c: ValueError: boom", "        1  other: late",
    ]  # fmt: skip
    assert "the last 2:" in text and "(not replayable)" in text
    assert render([], 5) == "no dead letters"
