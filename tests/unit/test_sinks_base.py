"""Pure parts of the sink layer: reports, header encoding, settings, reader-side dedup."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from millstream.errors import ConfigurationError
from millstream.headers import decode_time_header, encode_time, production_headers
from millstream.records import Production
from millstream.sinks._kafka import client_config, resolve_topic
from millstream.sinks.base import (
    SKIPPED_DELIVERED,
    Delivery,
    DeliveryReport,
    PartitionProgress,
    ShardRef,
)
from millstream.sinks.dedup_reader import DedupReader, message_id
from millstream.sinks.kafka_transactional import (
    KafkaTransactionalSink,
    progress_group,
    transactional_id,
)


def prod(seq: int, ts: int, sys_time: int) -> Production:
    return Production("s", "k", b"v", ts, f"id{seq}".encode(), sys_time, seq=seq)


def test_report_summarises_partitions_and_skips() -> None:
    shard = ShardRef("a", "c", 3)
    pairs = [
        (prod(1, 50, 500), Delivery(b"id1", 1, "t", 0, 10)),
        (prod(2, 40, 600), Delivery(b"id2", 2, "t", 0, 11)),
        (prod(3, 70, 100), Delivery(b"id3", 3, "t", 1, 4)),
        (prod(4, 1, 1), Delivery(b"id4", 4, "t", skipped=SKIPPED_DELIVERED)),
    ]
    report = DeliveryReport.build(shard, pairs)
    assert report.delivered == 3 and report.skipped == 1
    assert report.partitions == {
        ("t", 0): PartitionProgress(11, 40, 500),
        ("t", 1): PartitionProgress(4, 70, 100),
    }
    max_offset, min_event, min_system = report.partitions[("t", 0)]  # unpacks as a tuple
    assert (max_offset, min_event, min_system) == (11, 40, 500)
    assert pickle.loads(pickle.dumps(report)) == report
    assert str(shard) == "a.c.3"


def test_time_headers_are_big_endian_int64_and_ascii_still_reads() -> None:
    assert encode_time(1) == b"\x00" * 7 + b"\x01"
    assert encode_time(-1) == b"\xff" * 8
    for value in (0, 1_700_000_000_123, -5, 2**62):
        assert decode_time_header(encode_time(value)) == value
    assert decode_time_header(b"1700000000123") == 1_700_000_000_123
    assert decode_time_header(None) is None
    p = Production("s", "k", b"v", 7, b"\x01id", 9, seq=1, headers=(("x", b"y"),))
    assert production_headers(p) == [
        ("ms-id", b"\x01id"),
        ("ms-system-time", encode_time(9)),
        ("ms-event-time", encode_time(7)),
        ("x", b"y"),
    ]


def test_topic_mapping_forms() -> None:
    assert resolve_topic("t", "any") == "t"
    assert resolve_topic({"a": "ta"}, "a") == "ta"
    assert resolve_topic(lambda s: f"app.{s}", "a") == "app.a"
    with pytest.raises(ConfigurationError, match="no topic for stream 'b'"):
        resolve_topic({"a": "ta"}, "b")
    with pytest.raises(ConfigurationError, match="expected a topic name"):
        resolve_topic(lambda s: "", "a")


def test_client_config_refuses_to_weaken_guarantees() -> None:
    base = {"bootstrap.servers": "h:1"}
    merged = client_config(base, {"linger.ms": 1}, {"acks": "all", "enable.idempotence": True})
    assert merged == {
        "bootstrap.servers": "h:1",
        "linger.ms": 1,
        "acks": "all",
        "enable.idempotence": True,
    }
    assert client_config(base, {"acks": "ALL"}, {"acks": "all"})["acks"] == "all"
    with pytest.raises(ConfigurationError, match="acks"):
        client_config(base, {"acks": "1"}, {"acks": "all"})
    with pytest.raises(ConfigurationError, match=r"bootstrap\.servers"):
        client_config({}, None, {})


def test_transactional_names_are_deterministic() -> None:
    shard = ShardRef("app", "comp", 12)
    assert transactional_id(shard) == "millstream.app.comp.12"
    assert progress_group(shard, "out") == "millstream.progress.app.comp.12.out"
    with pytest.raises(ConfigurationError, match="transaction_timeout_ms"):
        KafkaTransactionalSink({"bootstrap.servers": "h:1"}, "t", delivery_timeout_s=120)


def test_transactional_sink_pickles_without_clients() -> None:
    sink = KafkaTransactionalSink({"bootstrap.servers": "h:1"}, {"s": "t"})
    copy = pickle.loads(pickle.dumps(sink))
    assert copy._kafka.producer == sink._kafka.producer


def test_dedup_reader_is_bounded_and_drops_repeats() -> None:
    reader = DedupReader(max_ids=3)
    assert [reader.first_time(i) for i in (b"a", b"b", b"a", b"c", b"d")] == [
        True,
        True,
        False,
        True,
        True,
    ]
    assert len(reader) == 3  # b fell out of the window (a was refreshed by its duplicate)
    assert reader.first_time(b"b") is True
    messages = [
        SimpleNamespace(headers=lambda: [("ms-id", b"x")]),
        SimpleNamespace(headers=(("ms-id", b"x"),)),
        SimpleNamespace(headers=lambda: None),
    ]
    assert message_id(messages[0]) == b"x" and message_id(messages[2]) is None
    assert len(list(DedupReader().filter(messages))) == 2
    with pytest.raises(ConfigurationError):
        DedupReader(max_ids=0)
