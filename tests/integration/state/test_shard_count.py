"""A computation's shard count is recorded at its first start; another count stops a start."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from millstream.errors import ConfigurationError
from millstream.state.shard_count import record_shard_count, shard_counts_key


def test_first_start_records_the_count_and_restarts_with_it_pass(
    store_client: Any, redis_namespace: str
) -> None:
    app = redis_namespace
    record_shard_count(store_client, app, "counter", 8)
    record_shard_count(store_client, app, "counter", 8)  # a restart with the same count
    record_shard_count(store_client, app, "joiner", 16)  # each computation has its own
    assert store_client.hgetall(shard_counts_key(app)) == {b"counter": b"8", b"joiner": b"16"}


def test_another_count_stops_the_start_with_one_line_naming_both(
    store_client: Any, redis_namespace: str
) -> None:
    app = redis_namespace
    record_shard_count(store_client, app, "counter", 8)
    with pytest.raises(ConfigurationError) as raised:
        record_shard_count(store_client, app, "counter", 16)
    message = str(raised.value)
    assert "\n" not in message
    assert "'counter'" in message and "with 8 shards" in message and "with 16" in message
    assert "millstream rescale" in message and "new app name" in message
    assert store_client.hget(shard_counts_key(app), "counter") == b"8"  # still the first count


def test_concurrent_first_starts_agree_on_one_count(
    store_client: Any, redis_namespace: str
) -> None:
    """Two drivers starting at once with different counts: one count wins, the other stops."""
    app = redis_namespace
    counts = [8, 16] * 4
    barrier = threading.Barrier(len(counts))
    outcome: dict[int, list[str]] = {}

    def start(index: int, shards: int) -> None:
        barrier.wait()
        try:
            record_shard_count(store_client, app, "counter", shards)
            outcome[index] = ["ok", str(shards)]
        except ConfigurationError:
            outcome[index] = ["stopped", str(shards)]

    threads = [threading.Thread(target=start, args=item) for item in enumerate(counts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    recorded = store_client.hget(shard_counts_key(app), "counter").decode()
    assert len(outcome) == len(counts)
    for status, shards in outcome.values():
        assert status == ("ok" if shards == recorded else "stopped"), (recorded, outcome)
