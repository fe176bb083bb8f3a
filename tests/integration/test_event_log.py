"""The join's log tier reader (`injectors/event_log.py`) against the real broker: events
spread over partitions and an hour of time, found by id around their time, not outside the
window, with the scan bounded. Ground truth is what the producer wrote."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import json_field
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors.event_log import search
from millstream.state.watermarks import now_ms

EVENTS, PARTITIONS, STEP_MS = 300, 3, 10_000  # one event every 10 s over 50 minutes
ID = json_field("query_id")


def _value(i: int, text: str | None = None) -> bytes:
    return json.dumps({"query_id": f"e{i}", "text": text or f"t{i}"}).encode()


@pytest.fixture
def event_topic(kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]) -> tuple[str, int]:
    """The events e0..e299 stamped STEP_MS apart, round robin over the partitions, plus a
    decoy: e150 again, an hour before the others, and one record no id can be read from.
    Each partition in time order, as the log tier assumes (a record stamped far out of order
    ends a partition's span early, as it misleads the broker's own time index)."""
    topic, base = kafka_topic_factory(partitions=PARTITIONS), now_ms() - 3_600_000
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    producer.produce(topic, value=_value(150, "decoy"), partition=0, timestamp=base - 3_600_000)
    for i in range(EVENTS):
        producer.produce(topic, value=_value(i), partition=i % PARTITIONS,
                         timestamp=base + i * STEP_MS)  # fmt: skip
        if i == 150:
            producer.produce(topic, value=b"not json", partition=1, timestamp=base + i * STEP_MS)
    assert producer.flush(30) == 0
    return topic, base


def _search(bootstrap: str, topic: str, wants: dict[str, list[tuple[int, int]]],
            **bounds: int) -> Any:  # fmt: skip
    options = KafkaInjectorOptions.parse({"bootstrap.servers": bootstrap, "topics": topic})
    return search([options], ID, wants, max_records=bounds.get("max_records", 10_000),
                  max_bytes=bounds.get("max_bytes", 1 << 20))  # fmt: skip


def test_events_are_found_by_id_around_their_time_and_only_there(
    kafka_bootstrap: str, event_topic: tuple[str, int]
) -> None:
    topic, base = event_topic
    at = {i: base + i * STEP_MS for i in range(EVENTS)}
    wants = {
        "e150": [(at[150] - 30_000, at[150] + 30_000)],  # the decoy is an hour before
        "e10": [(at[10] - 5_000, at[10] + 5_000)],
        "e11": [(at[11] - 1_000, at[11] + 1_000)],  # on another partition, next to e10
        "e200": [(at[100] - 30_000, at[100] + 30_000)],  # 1,000 s from where it is looked for
        "nowhere": [(at[50] - 5_000, at[50] + 5_000)],
    }
    result = _search(kafka_bootstrap, topic, wants)
    assert result.found == {"e150": _value(150), "e10": _value(10), "e11": _value(11)}
    assert not result.truncated
    # Around the time: the three spans hold 7 + 2 + 7 events (and the unreadable record),
    # read from where each starts in each partition, not from the beginning of the topic.
    assert 0 < result.scanned <= 20, result.describe()
    assert result.reads == 5 * PARTITIONS, result.describe()  # a range per span and partition
    # Where a span starts: the broker's time index, or (a broker that answers the earliest
    # offset whatever the time, as Tansu does) bisection, about log2(records) probes a range.
    assert result.probes <= result.reads * 8, result.describe()


def test_a_search_is_bounded_and_says_it_was_cut(
    kafka_bootstrap: str, event_topic: tuple[str, int]
) -> None:
    topic, base = event_topic
    everything = [(base - 7_200_000, base + EVENTS * STEP_MS)]
    whole = _search(kafka_bootstrap, topic, {"e299": everything})
    assert whole.found == {"e299": _value(299)} and not whole.truncated
    assert whole.scanned == EVENTS + 2  # every record, the decoy and the unreadable one too
    cut = _search(kafka_bootstrap, topic, {"e299": everything}, max_records=25)
    assert cut.truncated and cut.scanned == 25 and cut.found == {}
    small = _search(kafka_bootstrap, topic, {"e299": everything}, max_bytes=200)
    assert small.truncated and small.bytes >= 200 and small.scanned < 10
