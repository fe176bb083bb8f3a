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
    calls = [c for c in wire.calls() if c.transactional_id == txn_id]
    assert wire.errors == []
    assert [(c.api, c.committed, c.error_code) for c in calls] == [
        ("add_partitions", None, 0),
        ("end_txn", True, 0),
        ("add_partitions", None, 0),
        ("end_txn", False, 0),
    ]
    assert set(calls[0].partitions) == {(topic, 0), (topic, 1)}
    assert len({(c.producer_id, c.producer_epoch) for c in calls}) == 1
    assert all(c.answered_at is not None and c.answered_at >= c.sent_at for c in calls)
    assert [c.sent_at for c in calls] == sorted(c.sent_at for c in calls)
