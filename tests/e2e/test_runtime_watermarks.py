"""Low watermarks through three stages on real Spark, Redis and Kafka, sampled while data flows.

Each stage's published watermark never decreases, a downstream stage is never ahead of its
upstream (stage k+1 <= stage k, and every stage <= its own input watermark), every stage
advances, and no record is ever behind a downstream watermark (nothing counted late).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.state.keys import app_key
from millstream.state.watermarks import UNKNOWN, now_ms
from tests.e2e.conftest import metric, shard_states, wait_until

pytestmark = pytest.mark.spark

STAGES = ("s1", "s2", "s3")
JITTER_MS = 1000
WAVES = 16
PER_WAVE = 10


class Forward(Computation):
    """Stages 1 and 2: pass every record on, with its event time."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)
        ctx.produce(self.output, ctx.key, record.value)


class Count(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def _decode(raw: bytes | None) -> int | None:
    return None if raw is None else int(raw.decode().split(",")[0])


def test_watermarks_propagate_monotonically_through_three_stages(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    rng = random.Random(7)
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    topology = Topology(app_name)
    topology.source(
        "input", kafka_source(topic, id_header="rid"), max_out_of_order_ms=JITTER_MS + 2000
    )
    by_k = json_field("k")
    topology.computation("s1", Forward("one"), inputs={"input": by_k}, outputs=["one"], shards=2)
    topology.computation("s2", Forward("two"), inputs={"one": by_k}, outputs=["two"], shards=2)
    topology.computation("s3", Count(), inputs={"two": by_k}, shards=2)
    app = start_app(topology)

    fields = [name for stage in STAGES for name in (f"{stage}#input", stage)]
    wm_key = app_key(app_name, "wm")

    def snapshot() -> dict[str, int | None]:
        # One HMGET: an atomic snapshot of every stage's published watermarks.
        raw = redis_client.hmget(wm_key, fields)
        return dict(zip(fields, map(_decode, raw), strict=True))

    # Every stage has run batches (each publishes a real watermark) before data flows.
    wait_until(lambda: (snapshot()["s3"] or UNKNOWN) > 0, 60, "every stage to run", app)

    samples: list[dict[str, int | None]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(snapshot())
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    sent = 0
    max_ts = 0
    try:
        for wave in range(WAVES):
            now = now_ms()
            for i in range(PER_WAVE):
                ts = now - rng.randrange(JITTER_MS)
                max_ts = max(max_ts, ts)
                key = f"k{rng.randrange(8)}"
                producer.produce(
                    topic,
                    key=key,
                    value=json.dumps({"k": key}),
                    headers=[("rid", f"{wave}-{i}".encode())],
                    timestamp=ts,
                    partition=rng.randrange(2),
                )
                sent += 1
            assert producer.flush(10) == 0
            app.check()
            time.sleep(0.6)
        flowing = len(samples)  # samples taken while data was being sent

        def last_stage_passed_everything() -> bool:
            return bool(samples) and (samples[-1]["s3"] or UNKNOWN) > max_ts

        wait_until(last_stage_passed_everything, 45, "s3's watermark to pass every record", app)
    finally:
        stop.set()
        sampler.join(5)

    # Every record went through every stage, and none was behind a downstream watermark.
    assert sum(shard_states(redis_client, app_name, "s3", 2).values()) == sent
    for stage in STAGES:
        assert metric(redis_client, app_name, stage, "records") == sent, stage
        assert metric(redis_client, app_name, stage, "late") == 0, stage

    # Streams consumed only inside the application never touch Kafka: no topic, nothing in
    # flight; the hand-over inside the batch is the delivery channel.
    for stream in ("one", "two"):
        assert not redis_client.keys(app_key(app_name, "inflight", stream, "*")), stream
        topic_name = topology.topic_of(stream)
        listed = Producer({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
        assert topic_name not in listed.topics, f"{topic_name} was created"

    assert flowing >= 30, flowing
    series: dict[str, list[int]] = {name: [] for name in fields}
    for snap in samples:
        known = [snap[name] for name in fields]
        assert None not in known, snap  # every stage had published before sampling began
        for name in fields:
            series[name].append(snap[name] or UNKNOWN)
        # Downstream is never ahead: s3 <= s3#input <= s2 <= s2#input <= s1 <= s1#input.
        for upstream, downstream in itertools.pairwise(known):
            assert downstream is not None and upstream is not None
            assert downstream <= upstream, snap
    for name, values in series.items():
        assert values, f"{name} was never published"
        assert all(a <= b for a, b in itertools.pairwise(values)), f"{name} decreased"
    # All advance, step by step while data flows (not only once it stopped).
    for stage in STAGES:
        during = series[stage][:flowing]
        assert len(set(during)) >= 3, (stage, sorted(set(during)))
        assert len(set(series[stage])) >= 5, (stage, sorted(set(series[stage])))
        assert series[stage][-1] > max_ts, stage
