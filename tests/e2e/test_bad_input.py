"""Bad input on real Spark, Redis and Kafka (issue #9): every bad record is dead-lettered once.

One pipeline run per injector covers many record-level cases at once: good records are sent
interleaved with bad ones; afterwards every good record is counted exactly once (per-key sums,
checked against ground truth kept by the test) and every bad one is in `<app>.dead-letters`
with its reason and its position. Nothing is dropped as late or as an old duplicate.

Decisions these tests pin down (see README, "Bad input"):
- A Kafka record key that is not UTF-8 cannot be the key of the default extractor (keys are
  str): the record is dead-lettered with the decode error. Declare an extractor to accept it.
- A key plus value larger than MILLSTREAM_MAX_RECORD_BYTES (default 1 MiB) is dead-lettered
  with its size; the dead letter carries the first 16 KiB of the value and its length.
- A Kafka timestamp that is negative or -1 (no timestamp) is dead-lettered; so is a timestamp
  or event time more than MILLSTREAM_MAX_FUTURE_MS (default 1 day) ahead of the clock, which
  must not move the input low watermark either (it would make every later record late).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import (
    Computation,
    Context,
    Record,
    Topology,
    json_field,
    kafka_source,
    logfile_source,
)
from millstream.headers import HEADER_ID
from millstream.state.watermarks import WatermarkAuthority
from tests.e2e.conftest import metric, read_topic, shard_states, wait_until

pytestmark = pytest.mark.spark

SHARDS = 2
YEAR_2100_MS = 4_102_444_800_000
OVERSIZED = 2 * 1024 * 1024 + 17


class Tally(Computation):
    """Sums `amount` per key; every good record of the tests carries one."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + json.loads(record.value)["amount"])


def dead_letter_bodies(letters: list[Any]) -> list[dict[str, Any]]:
    """One body per dead-letter id (internal streams are at-least-once, read by id)."""
    by_id: dict[bytes, set[bytes]] = {}
    for message in letters:
        by_id.setdefault(dict(message.headers())[HEADER_ID], set()).add(message.value())
    assert all(len(values) == 1 for values in by_id.values()), by_id
    return [json.loads(next(iter(values))) for values in by_id.values()]


def test_bad_kafka_records_are_dead_lettered_and_good_ones_counted_once(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    app_name = redis_namespace
    # Apache Kafka refuses a 2 MiB record without a larger max.message.bytes on the topic.
    by_field = kafka_topic_factory(partitions=1, config={"max.message.bytes": str(4 << 20)})
    by_key = kafka_topic_factory(partitions=1)
    topology = Topology(app_name)
    topology.source("orders", kafka_source(by_field, name="orders"), max_out_of_order_ms=30_000)
    topology.source("keyed", kafka_source(by_key, name="keyed"), max_out_of_order_ms=30_000)
    topology.computation(
        "tally",
        Tally(),
        inputs={"orders": json_field("k"), "keyed": None},  # None: the Kafka record key
        shards=SHARDS,
    )

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 8 << 20})
    positions: dict[str, tuple[str, int, int]] = {}  # label -> (topic, partition, offset)

    def send(label: str, topic: str, value: bytes, key: bytes | None = None, ts: int = 0) -> None:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            positions[label] = (msg.topic(), msg.partition(), msg.offset())

        producer.produce(topic, key=key, value=value, timestamp=ts, on_delivery=delivered)

    truth: Counter[str] = Counter()
    good = 0

    def send_good(i: int) -> None:
        nonlocal good
        amount = 1 + i * 7 % 50
        key = f"k{i % 4}"
        if i % 3:
            send(f"good-{i}", by_field, json.dumps({"k": key, "amount": amount}).encode())
        else:
            send(f"good-{i}", by_key, json.dumps({"amount": amount}).encode(), key=key.encode())
        truth[key] += amount
        good += 1

    # First record of a partition: before the fix its year-2100 timestamp became the injector
    # watermark (the next unread record's time), and every later record was late and dropped.
    send("future-first", by_field, b'{"k": "k0", "amount": 1000}', ts=YEAR_2100_MS)
    bad: dict[str, bytes] = {
        "not-utf8-value": b'\xff\xfe{"k": "k1", "amount": 1000}',
        "not-json": b"k1=1000",
        "no-field": b'{"amount": 1000}',
        "not-an-object": b"[1000]",
        "oversized": json.dumps({"k": "k2", "amount": 1000, "pad": "x" * OVERSIZED}).encode(),
    }
    stamps = {
        "negative-ts": -5,
        "missing-ts": -1,
        "future-ts": int(time.time() * 1000) + 3 * 86_400_000,
    }
    for i in range(40):
        send_good(i)
        if i == 5:
            send("not-utf8-key", by_key, b'{"amount": 1000}', key=b"\xff\xfe")
        if i == 8:
            send("no-key", by_key, b'{"amount": 1000}')
        if 10 <= i < 10 + len(bad):
            label = list(bad)[i - 10]
            send(label, by_field, bad[label])
        if 20 <= i < 20 + len(stamps):
            label = list(stamps)[i - 20]
            send(label, by_field, b'{"k": "k3", "amount": 1000}', ts=stamps[label])
    expected = {
        "future-first": "ahead of the clock, more than maxFutureMs=86400000",
        "future-ts": "ahead of the clock, more than maxFutureMs=86400000",
        "negative-ts": "record has no valid timestamp (Kafka timestamp -5)",
        "missing-ts": "record has no valid timestamp (Kafka timestamp -1)",
        "not-utf8-value": "key extraction failed: UnicodeDecodeError",
        "not-json": "key extraction failed: JSONDecodeError",
        "no-field": "key extraction failed: KeyError: 'k'",
        "not-an-object": "key extraction failed: TypeError",
        "oversized": f"record of {len(bad['oversized'])} bytes (key plus value) exceeds "
        "MILLSTREAM_MAX_RECORD_BYTES=1048576",
        "not-utf8-key": "key extraction failed: UnicodeDecodeError: 'utf-8' codec can't decode",
        "no-key": "record has no key: declare a key extractor",
    }
    assert producer.flush(30) == 0
    assert set(positions) == {f"good-{i}" for i in range(40)} | set(expected)
    assert positions["future-first"][2] == 0

    # Small batches: the planner peeks at many "next unread" records, bad ones included.
    app = start_app(topology, shards=SHARDS, max_records_per_batch=16)

    def done() -> bool:
        return metric(redis_client, app_name, "tally", "records") >= good and metric(
            redis_client, app_name, "tally", "delivered"
        ) >= len(expected)

    wait_until(done, 120, "every good record counted and every dead letter delivered", app)
    bodies = dead_letter_bodies(
        read_topic(kafka_bootstrap, topology.topic_of("dead-letters"), expected=len(expected))
    )
    app.check()

    assert shard_states(redis_client, app_name, "tally", SHARDS) == dict(truth)
    assert metric(redis_client, app_name, "tally", "records") == good
    assert metric(redis_client, app_name, "tally", "late") == 0
    assert metric(redis_client, app_name, "tally", "remnants") == 0
    assert metric(redis_client, app_name, "tally", "dead_letters") == len(expected)

    by_position = {(b["source"], b["partition"], b["offset"]): b for b in bodies}
    assert len(by_position) == len(bodies) == len(expected), bodies
    for label, reason in expected.items():
        body = by_position.get(positions[label])
        assert body is not None, (label, positions[label], sorted(by_position))
        assert reason in body["error"], (label, body["error"])
        assert body["computation"] == "tally"
        assert body["stream"] == ("keyed" if positions[label][0] == by_key else "orders")
    assert by_position[positions["not-utf8-value"]]["value"].startswith("\\xff\\xfe{")
    assert by_position[positions["not-json"]]["value"] == "k1=1000"
    oversized = by_position[positions["oversized"]]
    assert oversized["value_truncated"] is True
    assert oversized["value_bytes"] == len(bad["oversized"])
    assert len(oversized["value"]) == 16 * 1024
    assert oversized["key"] == "k2"  # extracted before the size check; the record is known
    assert by_position[positions["future-first"]]["timestamp"] is None
    # The year-2100 records never became the injector's watermark estimate (the input
    # watermark is the min over both streams, so only the injector's own value shows it).
    orders_wm = WatermarkAuthority(redis_client, app_name).injector_watermark(
        "orders",
        [f"orders@{app_name}"],  # the fused query's instance of the source
    )
    assert 0 < orders_wm.event < int(time.time() * 1000) + 60_000, orders_wm


def _line(key: str, ts: int | None, amount: int) -> bytes:
    doc: dict[str, Any] = {"key": key, "amount": amount}
    if ts is not None:
        doc["ts"] = ts
    return json.dumps(doc).encode() + b"\n"


def test_bad_log_lines_are_dead_lettered_with_file_and_byte_offset(
    start_app: Any, redis_namespace: str, redis_client: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    app_name = redis_namespace
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "app.log"
    now = int(time.time() * 1000)
    truth: Counter[str] = Counter()
    lines: list[tuple[str | None, bytes]] = []  # (bad label or None, line)
    bad = {
        "not-json": b"key=a amount=1000\n",
        "no-ts": _line("a", None, 1000),
        "not-utf8": b'{"key": "\xff\xfe", "ts": ' + str(now).encode() + b', "amount": 1000}\n',
        "future-ts": _line("a", now + 3 * 86_400_000, 1000),
        "bad-ts-type": b'{"key": "a", "ts": "yesterday", "amount": 1000}\n',
    }
    for i in range(20):
        key = f"k{i % 3}"
        truth[key] += i + 1
        lines.append((None, _line(key, now + i, i + 1)))
        if 3 <= i < 3 + len(bad):
            label = list(bad)[i - 3]
            lines.append((label, bad[label]))
    offsets: dict[str, int] = {}
    position = 0
    for label, raw in lines:
        if label is not None:
            offsets[label] = position
        position += len(raw)
    path.write_bytes(b"".join(raw for _, raw in lines))

    topology = Topology(app_name)
    topology.source("clicks", logfile_source(str(logs)), max_out_of_order_ms=30_000)
    topology.computation("tally", Tally(), inputs={"clicks": None}, shards=SHARDS)
    app = start_app(topology, shards=SHARDS)
    good = len(lines) - len(bad)

    def done() -> bool:
        return metric(redis_client, app_name, "tally", "records") >= good and metric(
            redis_client, app_name, "tally", "delivered"
        ) >= len(bad)

    wait_until(done, 120, "every good line counted and every dead letter delivered", app)
    bodies = dead_letter_bodies(
        read_topic(kafka_bootstrap, topology.topic_of("dead-letters"), expected=len(bad))
    )
    app.check()

    assert shard_states(redis_client, app_name, "tally", SHARDS) == dict(truth)
    assert metric(redis_client, app_name, "tally", "records") == good
    assert metric(redis_client, app_name, "tally", "late") == 0
    assert metric(redis_client, app_name, "tally", "dead_letters") == len(bad)
    by_offset = {b["offset"]: b for b in bodies}
    assert sorted(by_offset) == sorted(offsets.values()), bodies
    reasons = {
        "not-json": "invalid JSON",
        "no-ts": "no timestamp (set missingTimestamp=system to use system time)",
        "not-utf8": "invalid JSON: 'utf-8' codec can't decode byte 0xff",
        "future-ts": "ahead of the clock, more than MILLSTREAM_MAX_FUTURE_MS=86400000",
        "bad-ts-type": "timestamp field 'ts' must be a number, got str",
    }
    for label, reason in reasons.items():
        body = by_offset[offsets[label]]
        assert reason in body["error"], (label, body["error"])
        assert body["stream"] == "clicks"
        if label != "future-ts":  # injector error rows name the file and the byte offset
            assert f"[file {path}," in body["error"], body["error"]
            assert f"byte offset {offsets[label]}]" in body["error"], body["error"]
    assert by_offset[offsets["not-utf8"]]["value"].startswith('{"key": "\\xff\\xfe"')
    assert by_offset[offsets["future-ts"]]["key"] == "a"
