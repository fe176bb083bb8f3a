"""How long the transactional sink resumes a commit whose outcome it does not know."""

from __future__ import annotations

import time

from millstream.sinks._shard_producer import ShardProducer as _ShardProducer
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
