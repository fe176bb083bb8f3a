"""How the transactional sink resumes a commit whose outcome it does not know, and how long."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from millstream.sinks._kafka import Deadline
from millstream.sinks._shard_producer import ShardProducer as _ShardProducer
from millstream.sinks.base import ShardRef
from millstream.sinks.kafka_transactional import KafkaTransactionalSink


def _sink() -> KafkaTransactionalSink:
    # No connection is made before setup()/deliver().
    return KafkaTransactionalSink(
        {"bootstrap.servers": "127.0.0.1:1"},
        "out",
        delivery_timeout_s=3,
        transaction_timeout_ms=10_000,
    )


def _state(committing: dict[str, int] | None, age_s: float) -> _ShardProducer:
    state = _ShardProducer(producer=None, txn_id="millstream.a.c.0")  # type: ignore[arg-type]
    state.committing = committing
    state.committing_since = time.monotonic() - age_s
    return state


def test_a_commit_in_doubt_is_resumed_within_the_transaction_timeout() -> None:
    assert not _sink()._doubt_outlived(_state({"out": 7}, age_s=9.0))


def test_past_the_transaction_timeout_the_producer_is_re_initialised() -> None:
    assert _sink()._doubt_outlived(_state({"out": 7}, age_s=11.0))


def test_no_commit_in_doubt_nothing_to_decide() -> None:
    assert not _sink()._doubt_outlived(_state(None, age_s=1000.0))


class _TimesOutOnce:
    """Stands in for librdkafka's producer: the first commit_transaction times out (broker away),
    the resumed one succeeds, as librdkafka reports when the re-sent EndTxn is answered."""

    def __init__(self) -> None:
        self.commits = 0

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1
        if self.commits == 1:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "EndTxn unanswered", retriable=True)
            )

    def purge(self, *args: Any, **kwargs: Any) -> None:
        pass


class _BrokerSays(KafkaTransactionalSink):
    """The sink with the broker's progress offsets replaced by a fixed answer (pure unit test)."""

    def __init__(self, committed: int) -> None:
        super().__init__({"bootstrap.servers": "127.0.0.1:1"}, "out", delivery_timeout_s=3)
        self.committed = committed

    def _fetch_progress(self, shard: ShardRef, stream: str, deadline: Deadline) -> tuple[int, Any]:
        return self.committed, None


def _in_doubt_then_resumed(sink: KafkaTransactionalSink) -> _ShardProducer:
    state = _ShardProducer(_TimesOutOnce(), "millstream.a.c.0")  # type: ignore[arg-type]
    state.progress, state.in_transaction = {"out": 4}, True
    shard = ShardRef("a", "c", 0)
    assert state.commit(shard, Deadline(0.05), {"out": 9}) is True  # timed out, then succeeded
    sink._confirm(state, shard, {"out": 9}, Deadline(1.0))
    return state


def test_a_resumed_commit_the_broker_shows_is_kept_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = _in_doubt_then_resumed(_BrokerSays(committed=9))
    assert state.progress == {"out": 9} and state.committing is None and not state.doubted
    assert not caplog.records


def test_a_broker_contradicting_a_resumed_commit_is_named_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = _in_doubt_then_resumed(_BrokerSays(committed=4))
    # librdkafka's answer stands (delivering again would double what the broker did commit)...
    assert state.progress == {"out": 9}
    # ...and the contradiction is in the log, with both figures.
    (record,) = caplog.records
    assert "shows seq 4, not 9" in record.getMessage() and "broker defect" in record.getMessage()


def test_a_commit_that_never_timed_out_needs_no_confirmation() -> None:
    state = _ShardProducer(_TimesOutOnce(), "millstream.a.c.0")  # type: ignore[arg-type]
    state.producer.commits = 1  # type: ignore[attr-defined]
    state.progress, state.in_transaction = {"out": 4}, True
    assert state.commit(ShardRef("a", "c", 0), Deadline(1.0), {"out": 9}) is False
