"""The low-watermark authority: monotonic, held by missing instances, percentile offered."""

from __future__ import annotations

from typing import Any

from millstream.state.watermarks import (
    NO_WORK,
    NONE_KNOWN,
    Watermark,
    WatermarkAuthority,
    percentile_watermark,
)


def test_published_watermark_never_decreases(store_client: Any, redis_namespace: str) -> None:
    authority = WatermarkAuthority(store_client, redis_namespace)
    assert authority.published("c") is None
    assert authority.publish("c", Watermark(100, 50)) == Watermark(100, 50)
    assert authority.publish("c", Watermark(90, 60)) == Watermark(100, 60)
    assert authority.published("c") == Watermark(100, 60)


def test_missing_injector_instance_holds_the_watermark(
    store_client: Any, redis_namespace: str
) -> None:
    authority = WatermarkAuthority(store_client, redis_namespace)
    authority.publish_injector("queries", "dc1@c", Watermark(1000, 1000))
    assert authority.injector_watermark("queries", ["dc1@c", "dc2@c"]) == NONE_KNOWN
    authority.publish_injector("queries", "dc2@c", Watermark(700, 800))
    assert authority.injector_watermark("queries", ["dc1@c", "dc2@c"]) == Watermark(700, 800)
    # A lower (stale) estimate from an instance is ignored.
    assert authority.publish_injector("queries", "dc2@c", Watermark(600, 600)) == Watermark(
        700, 800
    )
    authority.declare_injectors("queries", ["dc1@c", "dc2@c", "dc3@c"])
    assert authority.injector_stream("queries") == NONE_KNOWN


def test_in_flight_records_hold_consumer_until_read(
    store_client: Any, redis_namespace: str
) -> None:
    authority = WatermarkAuthority(store_client, redis_namespace)
    authority.add_in_flight("s", [(0, 9, Watermark(500, 510)), (1, 4, Watermark(300, 310))], "b1")
    assert authority.in_flight("s", 2, {}) == Watermark(300, 310)
    assert authority.in_flight("s", 2, {1: 5}) == Watermark(500, 510)
    assert authority.in_flight("s", 2, {0: 10, 1: 5}) == NO_WORK
    authority.retire_in_flight("s", {0: 10, 1: 5})
    assert store_client.zcard(f"ms:{{{redis_namespace}}}:inflight:s:0") == 0


def test_percentile_watermark() -> None:
    values = list(range(100))
    assert percentile_watermark(values, 1.0) == 0
    assert percentile_watermark(values, 0.99) == 0
    assert percentile_watermark(values, 0.9) == 9
