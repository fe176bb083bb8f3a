"""Timers on real Spark, Redis and Kafka.

Event-time timers fire only once the computation's input low watermark has passed them, exactly
once, in time order per key. Wall-time timers fire on time while no data arrives at all: the
injector's offsets carry a clock tick, so Spark runs empty batches in which they come due.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, Context, Record, Timer, Topology, json_field, kafka_source
from millstream.headers import HEADER_ID
from millstream.state.keys import ShardKeys
from millstream.state.watermarks import WatermarkAuthority, now_ms
from tests.e2e.conftest import read_topic, shard_states, wait_until

pytestmark = pytest.mark.spark

SHARDS = 2
EVENT_DELAY_MS = 3000  # event timers at record time + this
# Holds the watermark back, so a record a busy broker exposes a little late is not late.
OUT_OF_ORDER_MS = 2000
WALL_DELAY_MS = 2000  # wall timers at processing time + this


class TimerComputation(Computation):
    """Sets one timer per record; each firing is recorded in state and produced."""

    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        state = ctx.get_state({"set": {}, "fired": []})
        if body["kind"] == "event":
            at = record.timestamp + EVENT_DELAY_MS
            ctx.set_timer(body["tag"], at, "event")
        else:
            at = ctx.now + WALL_DELAY_MS
            ctx.set_timer(body["tag"], at, "wall")
        state["set"][body["tag"]] = at
        ctx.set_state(state)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.get_state({"set": {}, "fired": []})
        firing = {
            "tag": timer.tag,
            "time": timer.time,
            "domain": timer.domain.value,
            "low_watermark": ctx.low_watermark,
            "now": ctx.now,
        }
        state["fired"].append(firing)
        ctx.set_state(state)
        ctx.produce("fired", ctx.key, firing, timer.time)


def _send(producer: Producer, topic: str, key: str, tag: str, kind: str, timestamp: int) -> None:
    producer.produce(
        topic,
        key=key,
        value=json.dumps({"k": key, "tag": tag, "kind": kind}),
        headers=[("rid", tag.encode())],
        timestamp=timestamp,
    )


def test_event_timers_wait_for_the_watermark_and_wall_timers_fire_without_data(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    topology = Topology(app_name)
    topology.source(
        "input", kafka_source(topic, id_header="rid"), max_out_of_order_ms=OUT_OF_ORDER_MS
    )
    topology.computation(
        "timers",
        TimerComputation(),
        inputs={"input": json_field("k")},
        outputs=["fired"],
        shards=SHARDS,
    )
    app = start_app(topology)
    authority = WatermarkAuthority(redis_client, app_name)

    def input_watermark() -> int:
        published = authority.published("timers#input")
        return published.event if published is not None else -(2**62)

    # Let the query start, so the records below are read as soon as they are sent.
    wait_until(lambda: input_watermark() > 0, 60, "the first batch", app)

    # --- event-time timers ------------------------------------------------------------------
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    t0 = now_ms()
    expected: dict[str, dict[str, int]] = {}  # key -> tag -> timer time
    for key in ("a", "b", "c"):
        for offset_ms in (600, 0, 300):  # out of event-time order within each key
            tag = f"{key}-{offset_ms}"
            _send(producer, topic, key, tag, "event", t0 - offset_ms)
            expected.setdefault(key, {})[tag] = t0 - offset_ms + EVENT_DELAY_MS
    assert producer.flush(10) == 0
    all_times = {t for tags in expected.values() for t in tags.values()}
    timer_count = sum(len(tags) for tags in expected.values())

    pending_samples = 0  # samples in which a set timer was still ahead of the watermark
    deadline = time.monotonic() + 40
    while True:
        app.check()
        states = shard_states(redis_client, app_name, "timers", SHARDS)
        watermark = input_watermark()  # read after the state: a firing seen implies W >= T
        fired = [f for s in states.values() for f in s["fired"]]
        for firing in fired:
            assert firing["time"] <= watermark, (firing, watermark)
            assert firing["low_watermark"] >= firing["time"], firing
        set_times = {t for s in states.values() for t in s["set"].values()}
        if set_times == all_times and watermark < min(all_times):
            pending_samples += 1
            assert not fired, "a timer fired while the watermark was below every timer"
        if len(fired) >= timer_count:
            break
        assert time.monotonic() < deadline, f"timers did not fire: {fired} at W={watermark}"
        time.sleep(0.1)
    # The window in which the timers were set but not due was observed, so the assertions
    # above were not vacuous.
    assert pending_samples >= 3, pending_samples

    states = shard_states(redis_client, app_name, "timers", SHARDS)
    for key, tags in expected.items():
        fired = states[key]["fired"]
        assert {f["tag"]: f["time"] for f in fired} == tags, key  # each timer, exactly once
        assert len(fired) == len(tags), key
        times = [f["time"] for f in fired]
        assert times == sorted(times), f"{key}: fired out of time order: {times}"
        assert all(f["domain"] == "event" for f in fired)
    for shard in range(SHARDS):
        assert redis_client.zcard(ShardKeys(app_name, "timers", shard).timers("event")) == 0

    # --- wall-time timers, with no data arriving at all ---------------------------------------
    _send(producer, topic, "w", "wall-1", "wall", now_ms())
    assert producer.flush(10) == 0

    def wall_timer_set() -> bool:
        return "wall-1" in shard_states(redis_client, app_name, "timers", SHARDS).get(
            "w", {"set": {}}
        ).get("set", {})

    wait_until(wall_timer_set, 30, "the wall timer to be set", app)
    due = shard_states(redis_client, app_name, "timers", SHARDS)["w"]["set"]["wall-1"]
    # Nothing is sent from here on: only the clock tick in the offsets makes batches run.

    def wall_fired() -> bool:
        return bool(shard_states(redis_client, app_name, "timers", SHARDS)["w"]["fired"])

    wait_until(wall_fired, (due - now_ms()) / 1000 + 8, "the wall timer to fire", app)
    observed = now_ms()
    [firing] = shard_states(redis_client, app_name, "timers", SHARDS)["w"]["fired"]
    assert firing["domain"] == "wall"
    assert firing["time"] == due
    # On time: in the first batch that started once it was due (batches run every ~200 ms
    # while idle; a slow batch on a loaded machine may delay the next one by a few seconds).
    assert due <= firing["now"] <= due + 4000, f"fired at {firing['now']}, due {due}"
    assert observed - due < 8000

    # The productions of every firing reached the output stream exactly once (by tag).
    output = read_topic(kafka_bootstrap, topology.topic_of("fired"), expected=timer_count + 1)
    by_id = {dict(m.headers())[HEADER_ID]: m.value() for m in output}  # consumers dedup by id
    tags = Counter(json.loads(value)["tag"] for value in by_id.values())
    assert tags == Counter({tag: 1 for tags_ in expected.values() for tag in tags_} | {"wall-1": 1})
