"""The marker-aware reader, and the broker facts the transactional sink's progress relies on."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from millstream.testing.committed_reader import (
    probe_aborted_leak,
    read_committed,
    read_committed_settled,
    read_raw,
    read_with_consumer,
)


def _txn_producer(bootstrap: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(20)
    return producer


def test_reader_applies_markers_like_read_committed(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]
) -> None:
    topic = kafka_topic_factory(partitions=1)
    plain = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    plain.produce(topic, b"plain-1", headers=[("h", b"\x00\x01")])
    plain.flush(20)
    txn = _txn_producer(kafka_bootstrap)
    txn.begin_transaction()
    txn.produce(topic, b"committed", key=b"k")
    txn.commit_transaction(20)
    txn.begin_transaction()
    txn.produce(topic, b"aborted")
    txn.flush(20)
    txn.abort_transaction(20)
    plain.produce(topic, b"plain-2")
    plain.flush(20)

    seen = read_committed(kafka_bootstrap, topic)
    assert [r.value for r in seen] == [b"plain-1", b"committed", b"plain-2"]
    assert seen[0].headers == (("h", b"\x00\x01"),) and not seen[0].transactional
    assert seen[1].key == b"k" and seen[1].transactional
    batches, high_watermark = read_raw(kafka_bootstrap, topic, 0)
    assert sum(b.control for b in batches) == 2  # one COMMIT, one ABORT marker
    assert high_watermark == batches[-1].next_offset

    # an open transaction hides itself and everything after it (the last stable offset)
    txn.begin_transaction()
    txn.produce(topic, b"open")
    txn.flush(20)
    plain.produce(topic, b"after-open")
    plain.flush(20)
    assert [r.value for r in read_committed(kafka_bootstrap, topic)] == [
        b"plain-1",
        b"committed",
        b"plain-2",
    ]
    txn.commit_transaction(20)
    assert [r.value for r in read_committed(kafka_bootstrap, topic)][-2:] == [
        b"open",
        b"after-open",
    ]


def test_settled_read_waits_for_the_markers_of_open_transactions(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]
) -> None:
    """A transaction still open when the read starts is waited for (here committed 1 s
    later); one that stays open is given up on after the wait, and hides its records."""
    topic = kafka_topic_factory(partitions=1)
    txn = _txn_producer(kafka_bootstrap)
    txn.begin_transaction()
    txn.produce(topic, b"late")
    txn.flush(20)
    committer = threading.Timer(1.0, txn.commit_transaction, args=(20,))
    committer.start()
    started = time.monotonic()
    assert [r.value for r in read_committed_settled(kafka_bootstrap, topic, wait_s=30)] == [b"late"]
    assert 0.9 < time.monotonic() - started < 25
    committer.join()
    txn.begin_transaction()
    txn.produce(topic, b"open")
    txn.flush(20)
    started = time.monotonic()
    assert [r.value for r in read_committed_settled(kafka_bootstrap, topic, wait_s=2)] == [b"late"]
    assert time.monotonic() - started >= 2
    txn.abort_transaction(20)


def test_probe_reports_the_broker_truthfully(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]
) -> None:
    """The probe's answer matches what a plain read_committed consumer really does."""
    topic = kafka_topic_factory(partitions=1)
    txn = _txn_producer(kafka_bootstrap)
    txn.begin_transaction()
    txn.produce(topic, b"aborted")
    txn.flush(20)
    txn.abort_transaction(20)
    txn.begin_transaction()
    txn.produce(topic, b"committed")
    txn.commit_transaction(20)
    values = [m.value() for m in read_with_consumer(kafka_bootstrap, topic)]
    assert b"committed" in values
    assert probe_aborted_leak(kafka_bootstrap) == (b"aborted" in values)
    assert [r.value for r in read_committed(kafka_bootstrap, topic)] == [b"committed"]


def test_transactional_offsets_follow_the_transaction_outcome(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]
) -> None:
    """Why the sink keeps progress in transactional offsets: pending, aborted and fenced
    offset commits stay invisible to Consumer.committed(); only committed ones show."""
    anchor = kafka_topic_factory(partitions=1)
    group = f"progress-{uuid.uuid4().hex}"
    reader = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    meta = reader.consumer_group_metadata()
    tp = TopicPartition(anchor, 0)

    def committed() -> int:
        return reader.committed([tp], timeout=20)[0].offset

    def send(producer: Producer, offset: int) -> None:
        producer.send_offsets_to_transaction([TopicPartition(anchor, 0, offset)], meta, 20)

    try:
        txn_id = f"progress-{uuid.uuid4().hex}"
        first = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": txn_id})
        first.init_transactions(20)
        first.begin_transaction()
        send(first, 6)
        first.commit_transaction(20)
        assert committed() == 6

        first.begin_transaction()
        send(first, 11)
        assert committed() == 6  # pending
        first.abort_transaction(20)
        assert committed() == 6  # aborted

        first.begin_transaction()
        send(first, 21)  # then a new owner initialises the same id
        second = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": txn_id})
        second.init_transactions(20)
        assert committed() == 6  # the zombie's pending offsets were aborted
        second.begin_transaction()
        send(second, 31)
        second.commit_transaction(20)
        assert committed() == 31
    finally:
        reader.close()
