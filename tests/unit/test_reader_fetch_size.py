"""`injectors/_kafka_read.fetch_max_bytes`: a reader's fetch responses are capped, and the cap
never makes librdkafka refuse a consumer the user's own settings allow."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException

from millstream.injectors._kafka_read import FETCH_MAX_BYTES, fetch_max_bytes


def _consumer(kafka: dict[str, str]) -> None:
    """librdkafka validates the configuration when the client is created (no broker needed)."""
    config = {
        **kafka,
        "bootstrap.servers": "127.0.0.1:9",
        "group.id": "millstream-test",
        "fetch.max.bytes": fetch_max_bytes(kafka),
    }
    Consumer(config).close()


def test_a_readers_responses_are_capped_at_a_mebibyte() -> None:
    assert fetch_max_bytes({}) == FETCH_MAX_BYTES == 1024 * 1024
    _consumer({})


def test_a_larger_message_max_bytes_raises_the_cap_with_it() -> None:
    assert fetch_max_bytes({"message.max.bytes": "5000000"}) == 5_000_000
    _consumer({"message.max.bytes": "5000000"})
    with pytest.raises(KafkaException, match=r"fetch\.max\.bytes"):  # what the cap must avoid
        Consumer(
            {"message.max.bytes": "5000000", "fetch.max.bytes": FETCH_MAX_BYTES, "group.id": "g"}
        )


def test_the_users_own_fetch_max_bytes_stands() -> None:
    assert fetch_max_bytes({"fetch.max.bytes": "8388608"}) == "8388608"
    _consumer({"fetch.max.bytes": "8388608"})
