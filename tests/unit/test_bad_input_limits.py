"""Bad-input bounds (issue #9): settings, the runtime's reject rule, dead-letter size, Redis OOM.

The end-to-end behaviour is in tests/e2e/test_bad_input.py and test_bad_infra.py; these pin
the pure rules down cheaply.
"""

from __future__ import annotations

import json

import pytest
import redis

from millstream.connectors.key_runner import DEAD_LETTER_VALUE_BYTES, dead_letter
from millstream.connectors.key_runner import rejected as _rejected
from millstream.connectors.out_of_memory import redis_out_of_memory
from millstream.connectors.plan import BatchPlan
from millstream.connectors.topology import ComputationOptions, ComputationSpec
from millstream.errors import ConfigurationError
from millstream.settings import Settings
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import Watermark

NOW = 1_800_000_000_000


def _plan(**overrides: int) -> BatchPlan:
    return BatchPlan(
        app="a",
        batch_id=1,
        redis_url="redis://localhost:6379/0",
        shards=1,
        shard_config=ShardConfig(),
        input_watermark=Watermark(NOW - 5000, NOW - 5000),
        gc_watermark=0,
        now=NOW,
        user_retries=0,
        fail_stop=False,
        internal_inputs=frozenset(),
        deliveries={},
        in_flight_streams=frozenset(),
        **overrides,
    )


def _row(key: bytes | None, value: bytes | None, ts: int | None) -> tuple:
    # INJECTED_SCHEMA order: stream id key value timestamp system source partition offset ...
    return ("s", b"id", key, value, ts, NOW, "topic", 3, 42, [], None)


def test_settings_defaults_and_validation() -> None:
    settings = Settings.from_env({})
    assert (settings.max_record_bytes, settings.max_future_ms) == (1 << 20, 86_400_000)
    settings = Settings.from_env(
        {"MILLSTREAM_MAX_RECORD_BYTES": "4096", "MILLSTREAM_MAX_FUTURE_MS": "0"}
    )
    assert (settings.max_record_bytes, settings.max_future_ms) == (4096, 0)
    with pytest.raises(ConfigurationError, match="MILLSTREAM_MAX_RECORD_BYTES='10' is invalid"):
        Settings.from_env({"MILLSTREAM_MAX_RECORD_BYTES": "10"})
    with pytest.raises(ConfigurationError, match="MILLSTREAM_MAX_FUTURE_MS='-1' is invalid"):
        Settings.from_env({"MILLSTREAM_MAX_FUTURE_MS": "-1"})


def test_size_counts_key_plus_value_and_names_the_setting() -> None:
    plan = _plan(max_record_bytes=1024)
    assert _rejected(plan, _row(b"k" * 24, b"v" * 1000, NOW)) is None
    reason = _rejected(plan, _row(b"k" * 25, b"v" * 1000, NOW))
    assert reason == (
        "record of 1025 bytes (key plus value) exceeds MILLSTREAM_MAX_RECORD_BYTES=1024; "
        "raise it to accept such records"
    )


def test_event_time_beyond_the_future_bound_is_rejected() -> None:
    plan = _plan(max_future_ms=1000)
    assert _rejected(plan, _row(b"k", b"v", NOW + 1000)) is None
    assert _rejected(plan, _row(b"k", b"v", None)) is None
    reason = _rejected(plan, _row(b"k", b"v", NOW + 1001))
    assert reason == (
        f"event time {NOW + 1001} is 1001 ms ahead of the clock, more than "
        "MILLSTREAM_MAX_FUTURE_MS=1000"
    )


def test_dead_letter_truncates_large_values_and_keeps_a_sane_timestamp() -> None:
    spec = ComputationSpec("c", object(), {}, frozenset(), ComputationOptions())  # type: ignore[arg-type]
    plan = _plan()
    big = b"\xff" + b"x" * (3 * DEAD_LETTER_VALUE_BYTES)
    letter = dead_letter(plan, spec, "k", "too big", _row(b"k", big, NOW + 10 * 86_400_000))
    body = json.loads(letter.value)
    assert body["value"] == "\\xff" + "x" * (DEAD_LETTER_VALUE_BYTES - 1)
    assert (body["value_bytes"], body["value_truncated"]) == (len(big), True)
    assert (body["source"], body["partition"], body["offset"]) == ("topic", 3, 42)
    assert letter.timestamp == NOW  # not the far-future one
    small = json.loads(dead_letter(plan, spec, "k", "r", _row(b"k", b"v", -5)).value)
    assert small["value"] == "v" and "value_bytes" not in small
    assert dead_letter(plan, spec, "k", "r", _row(b"k", b"v", NOW - 7)).timestamp == NOW - 7


def test_redis_out_of_memory_is_recognised_raised_here_or_from_a_spark_task() -> None:
    assert redis_out_of_memory(
        redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    )
    # What reaches the driver when a shard task hit it: the worker's traceback, as text.
    spark_failure = RuntimeError(
        "Job aborted ... redis.exceptions.OutOfMemoryError: command not allowed when used "
        "memory > 'maxmemory'. ..."
    )
    assert redis_out_of_memory(spark_failure)
    assert not redis_out_of_memory(redis.ConnectionError("Connection refused"))
    assert not redis_out_of_memory(ValueError("maxmemory"))
