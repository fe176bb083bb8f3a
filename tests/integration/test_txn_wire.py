"""TxnWireLog behind a TcpProxy, on a real broker: it records what the broker answered to the
transactional requests of a real librdkafka producer, committed and aborted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from millstream.testing.infra import create_topic
from millstream.testing.txn_wire import TxnWireLog
from tests.e2e.sink_faults import start_recorded_kafka


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[str, TxnWireLog]]:
    with start_recorded_kafka(tmp_path / "kafka") as kafka:  # as the sink fault tests run it
        yield kafka.bootstrap, kafka.wire


def test_the_wire_log_records_each_transactions_partitions_and_end(
    proxied: tuple[str, TxnWireLog],
) -> None:
    bootstrap, wire = proxied
    topic = create_topic(bootstrap, partitions=2)
    txn_id = f"wire-{uuid.uuid4().hex}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    for commit in (True, False):
        producer.begin_transaction()
        producer.produce(topic, b"a", partition=0)
        producer.produce(topic, b"b", partition=1)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    again = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    again.init_transactions(30)  # the id initialised again: same producer id, next epoch
    # An InitProducerId refused while the coordinator loads is retried: the answered ones.
    calls = [
        c
        for c in wire.calls()
        if c.transactional_id == txn_id and (c.api != "init_producer" or c.error_code == 0)
    ]
    assert wire.errors == []
    assert [(c.api, c.committed, c.error_code) for c in calls] == [
        ("init_producer", None, 0),
        ("add_partitions", None, 0),
        ("end_txn", True, 0),
        ("add_partitions", None, 0),
        ("end_txn", False, 0),
        ("init_producer", None, 0),
    ]
    assert set(calls[1].partitions) == {(topic, 0), (topic, 1)}
    assert len({(c.producer_id, c.producer_epoch) for c in calls[:-1]}) == 1
    assert calls[-1].producer_id == calls[0].producer_id
    assert calls[-1].producer_epoch == calls[0].producer_epoch + 1
    assert all(c.answered_at is not None and c.answered_at >= c.sent_at for c in calls)
    assert [c.sent_at for c in calls] == sorted(c.sent_at for c in calls)


def test_the_wire_log_records_the_offsets_the_group_coordinator_answers(
    proxied: tuple[str, TxnWireLog],
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    bootstrap, wire = proxied
    topic, progress = create_topic(bootstrap, partitions=1), create_topic(bootstrap, partitions=1)
    group = f"progress-{uuid.uuid4().hex}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "client.id": "wire-reader",
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": group})
    producer.init_transactions(30)
    try:
        assert consumer.committed([TopicPartition(progress, 0)], timeout=10)[0].offset < 0
        for offset in (7, 12):
            producer.begin_transaction()
            producer.produce(topic, b"a")
            producer.flush(30)
            producer.send_offsets_to_transaction(
                [TopicPartition(progress, 0, offset)], consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            (got,) = consumer.committed([TopicPartition(progress, 0)], timeout=10)
            assert got.offset == offset
    finally:
        consumer.close()
    mine = [a for a in wire.offset_answers() if a.group == group]
    answers = [(a.topic, a.partition, a.offset) for a in mine]
    assert wire.errors == []
    # No committed offset yet is answered as -1: recorded too, the broker's word all the same.
    assert answers == [(progress, 0, -1), (progress, 0, 7), (progress, 0, 12)]
    assert all(a.client_id == "wire-reader" and 0 < a.asked_at <= a.answered_at for a in mine)
    # The transaction's own offset commits, as sent and answered.
    sent = [c for c in wire.calls() if c.api == "txn_offsets" and c.transactional_id == group]
    assert [(c.group, c.offsets, c.error_code) for c in sent] == [
        (group, ((progress, 0, 7),), 0),
        (group, ((progress, 0, 12),), 0),
    ]
