"""The transactional sink's progress and its setup checks: Kafka admin and consumer calls.

Progress is a consumer group's committed offset per (shard, stream): highest delivered seq + 1,
on partition 0 of the progress topic, committed in the same transaction as the records
(`kafka_transactional.py` says why offsets). Here: reading it back, creating the topic, and
proving at setup that the broker and its ACLs allow transactions.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from millstream.errors import ConfigurationError, FencedError, MillstreamError, TransientError
from millstream.kafka_errors import classify, kafka_error
from millstream.sinks._kafka import Deadline
from millstream.sinks._shard_producer import RETRY_PAUSE_S
from millstream.sinks.base import ShardRef

# The sink's own logger: its resumed-commit warnings keep the name operators filter them by.
log = logging.getLogger("millstream.sinks.kafka_transactional")

PROGRESS_PARTITION = 0
NO_PROGRESS = -1


def progress_group(shard: ShardRef, stream: str) -> str:
    """The consumer group whose committed offset is `highest delivered seq + 1`."""
    return f"millstream.progress.{shard.app}.{shard.computation}.{shard.shard}.{stream}"


def fetch_progress(
    connection: Mapping[str, Any], name: str, shard: ShardRef, stream: str, deadline: Deadline
) -> tuple[int, Any]:
    """(highest committed seq, consumer group metadata) of (shard, stream) on the broker."""
    group = progress_group(shard, stream)
    consumer = Consumer(
        {
            **connection,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    try:
        tp = TopicPartition(name, PROGRESS_PARTITION)
        while True:
            error: KafkaError | None
            try:
                (got,) = consumer.committed([tp], timeout=max(0.1, deadline.left()))
                error = got.error
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is None:
                    raise
            if error is None:
                break
            if not error.retriable() or deadline.expired():
                raise classify(error, f"shard {shard}: reading progress of group {group!r}")
            time.sleep(RETRY_PAUSE_S)
        seq = got.offset - 1 if got.offset >= 0 else NO_PROGRESS
        return seq, consumer.consumer_group_metadata()
    finally:
        consumer.close()


def confirm_resumed_commit(
    fetch: Callable[[str, Deadline], tuple[int, Any]],
    txn_id: str,
    top: Mapping[str, int],
    deadline: Deadline,
) -> None:
    """Compare a resumed commit's reported success with the broker's progress offsets
    (`fetch(stream, deadline)`, as `fetch_progress` answers).

    On Apache Kafka they always agree. A broker that breaks the atomicity of a transaction
    across a restart can disagree both ways (Tansu: committed records without the offset
    commit, or an offset commit with aborted records), and then no client choice is right:
    delivering again would double the records it did commit. So the sink keeps librdkafka's
    answer, as its contract says, and logs the contradiction where an operator sees it.
    """
    for stream, seq in sorted(top.items()):
        try:
            committed, _ = fetch(stream, deadline)
        except MillstreamError as exc:
            log.warning("%s: progress not readable after a resumed commit: %s", txn_id, exc)
            return
        if committed < seq:
            log.warning(
                "%s: commit_transaction reported success after timing out, but the broker's "
                "progress for stream %r shows seq %d, not %d: the broker did not apply the "
                "transaction's offset commit with its records (a broker defect; its records "
                "may be lost or, if delivered again, doubled)",
                txn_id,
                stream,
                committed,
                seq,
            )


def ensure_progress_topic(connection: Mapping[str, Any], name: str, timeout: float) -> None:
    """Create the progress topic (1 partition, compacted) unless it exists."""
    admin = AdminClient(dict(connection))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TransientError(
            f"Kafka at {connection.get('bootstrap.servers')} did not answer ({exc}): "
            "check the bootstrap servers and that the broker runs"
        ) from None
    if name in metadata.topics:
        return
    topic = NewTopic(
        name,
        num_partitions=1,
        replication_factor=-1,
        config={"cleanup.policy": "compact", "retention.ms": "-1"},
    )
    future = admin.create_topics([topic], operation_timeout=timeout)[name]
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise ConfigurationError(
            f"cannot create the progress topic {name!r} ({exc}): create it "
            "yourself (1 partition, cleanup.policy=compact) or grant CreateTopics"
        ) from None


def probe_transactions(
    producer_config: Mapping[str, Any], connection: Mapping[str, Any], timeout: float
) -> None:
    """init_transactions with a throw-away id: proves the broker and ACLs allow them."""
    probe_id = f"millstream.setup-probe.{socket.gethostname()}.{os.getpid()}"
    producer = Producer({**producer_config, "transactional.id": probe_id})
    try:
        producer.init_transactions(timeout)
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is not None and err.code() == KafkaError._TIMED_OUT:
            raise ConfigurationError(
                f"Kafka at {connection.get('bootstrap.servers')} did not initialise a "
                f"transaction within {timeout:.0f}s: transactions need a "
                "transaction coordinator (on a single-broker Apache Kafka set "
                "transaction.state.log.replication.factor=1 and "
                "transaction.state.log.min.isr=1), or use KafkaIdempotentSink"
            ) from None
        if err is not None:
            error: MillstreamError = classify(err, "transactions are unavailable")
            if isinstance(error, TransientError | FencedError):
                error = ConfigurationError(
                    f"transactions are unavailable on {connection.get('bootstrap.servers')}"
                    f": {err.name()} ({err.str()}); use Apache Kafka 2.5+ or KafkaIdempotentSink"
                )
            raise error from None
        raise
    finally:
        producer.purge(in_queue=True, in_flight=False, blocking=False)
