"""TopologyTestDriver against the real runtime: the same records through both, the same output.

1. A windowed count per key (event-time timer at the window's end, stamped there) feeding a
   per-window total (timer 1 ms after the window's counts are stamped), on the shared Spark
   session, real Redis and broker; duplicates and a record whose key cannot be extracted
   included. Both stages' outputs, the dead letter and the duplicate count must agree, and
   both sides' outputs must equal ground truth computed from what was sent (`_ground_truth`).
2. The examples/page_views pipeline as users run it, `millstream run
   examples.page_views.pipeline:topology` in its own process, with its file sink: the files
   must hold what the driver says the sink receives.

Outputs are compared as sets of (key, value, timestamp): the order across keys may differ.
The runtime's are read once its last stage's published low watermark has passed the last
result's timestamp: pending productions hold that watermark, so everything is delivered then.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream import Computation, Context, Record, Timer, Topology, json_field, kafka_source
from millstream.headers import HEADER_ID
from millstream.records import Production
from millstream.state.watermarks import UNKNOWN, WatermarkAuthority, now_ms
from millstream.testing import TopologyTestDriver
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import metric, read_topic, wait_until

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
WINDOW_MS = 1000
OUT_OF_ORDER_MS = 2000
KEYS = ("a", "b", "c", "d")

Sent = tuple[str, str | None, bytes, int]  # id, Kafka key, value, timestamp


class WindowCount(Computation):
    """Per key: counts per window; the window's timer emits the count at the window's end."""

    def process_record(self, ctx: Context, record: Record) -> None:
        start = record.timestamp - record.timestamp % WINDOW_MS
        counts = ctx.get_state({})
        counts[str(start)] = counts.get(str(start), 0) + 1
        ctx.set_state(counts)
        ctx.set_timer(str(start), start + WINDOW_MS)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        n = counts.pop(timer.tag)
        ctx.produce("counts", ctx.key, {"k": ctx.key, "w": int(timer.tag), "n": n})
        if counts:
            ctx.set_state(counts)
        else:
            ctx.delete_state()


class WindowTotal(Computation):
    """Per window: every key's count, reported 1 ms after they were stamped."""

    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        counts = ctx.get_state({})
        counts[body["k"]] = body["n"]
        ctx.set_state(counts)
        ctx.set_timer("total", record.timestamp + 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        ctx.produce(
            "totals",
            ctx.key,
            {"w": int(ctx.key), "keys": sorted(counts), "n": sum(counts.values())},
        )
        ctx.delete_state()


def _contract_topology(app: str, topic: str) -> Topology:
    topology = Topology(app)
    topology.source(
        "events", kafka_source(topic, id_header="id"), max_out_of_order_ms=OUT_OF_ORDER_MS
    )
    topology.computation(
        "count", WindowCount(), inputs={"events": json_field("k")}, outputs=["counts"], shards=2
    )
    topology.computation(
        "total", WindowTotal(), inputs={"counts": json_field("w")}, outputs=["totals"], shards=2
    )
    # Handed from count to total inside each batch; published so the test can read it too.
    topology.publish("counts")
    return topology


def _send_bursts(
    bootstrap: str, topic: str, id_header: str, make: Any, rng: random.Random, bursts: int = 3
) -> list[Sent]:
    """`bursts` bursts 1 s apart, stamped up to 600 ms before the send (on time for the
    runtime's idle estimate); some records are sent twice with their id (duplicates). The id
    travels in the `id_header` header, where the topology's kafka_source reads it."""
    producer = Producer({"bootstrap.servers": bootstrap})
    sent: list[Sent] = []
    for burst in range(bursts):
        now = now_ms()
        batch = [make(f"e{burst}-{i}", now - rng.randrange(600), rng) for i in range(15)]
        batch += rng.sample(batch, 3)
        for rid, key, value, ts in batch:
            producer.produce(
                topic, key=key, value=value, headers=[(id_header, rid.encode())], timestamp=ts
            )
        sent += batch
        assert producer.flush(10) == 0
        time.sleep(1.0)
    return sent


def _drive(driver: TopologyTestDriver, stream: str, sent: list[Sent]) -> None:
    for rid, key, value, ts in sent:
        driver.send(stream, value, key=key, timestamp=ts, id=rid)
    driver.advance_watermark(max(ts for *_, ts in sent) + 10 * WINDOW_MS + OUT_OF_ORDER_MS)


def _triples(productions: list[Production]) -> set[tuple[str, bytes, int]]:
    return {(p.key, p.value, p.timestamp) for p in productions}


def _topic_triples(bootstrap: str, topic: str, expected: int) -> set[tuple[str, bytes, int]]:
    """A stream's topic, deduplicated by production id as its consumers do."""
    by_id = {}
    for message in read_topic(bootstrap, topic, expected=expected):
        headers = dict(message.headers() or [])
        by_id[headers[HEADER_ID]] = (
            message.key().decode(),
            message.value(),
            message.timestamp()[1],
        )
    return set(by_id.values())


def _ground_truth(sent: list[Sent]) -> tuple[set[tuple], set[tuple]]:
    """The two stages' outputs computed from what was sent, without millstream: each id once,
    records whose value is not JSON left out, counts per (key, window) stamped at the window's
    end, and per window the keys and their total stamped 1 ms later. Decoded, as
    (key, body items, timestamp)."""
    first: dict[str, tuple[bytes, int]] = {}
    for rid, _, value, ts in sent:
        first.setdefault(rid, (value, ts))
    counts: dict[tuple[str, int], int] = {}
    for value, ts in first.values():
        try:
            key = json.loads(value)["k"]
        except ValueError:
            continue
        window = ts - ts % WINDOW_MS
        counts[(key, window)] = counts.get((key, window), 0) + 1
    by_window: dict[int, dict[str, int]] = {}
    for (key, window), n in counts.items():
        by_window.setdefault(window, {})[key] = n
    return (
        {(k, _items({"k": k, "w": w, "n": n}), w + WINDOW_MS) for (k, w), n in counts.items()},
        {
            (str(w), _items({"w": w, "keys": sorted(c), "n": sum(c.values())}), w + WINDOW_MS + 1)
            for w, c in by_window.items()
        },
    )


def _items(body: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in body.items()))


def _decoded(triples: set[tuple[str, bytes, int]]) -> set[tuple]:
    return {(key, _items(json.loads(value)), ts) for key, value, ts in triples}


def _published(client: Any, app: str, name: str) -> int:
    watermark = WatermarkAuthority(client, app).published(name)
    return UNKNOWN if watermark is None else watermark.event


def test_driver_and_runtime_agree_on_a_two_stage_windowed_topology(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
) -> None:
    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    topology = _contract_topology(app, topic)
    runtime = start_app(topology)
    wait_until(lambda: _published(redis_client, app, "count#input") > 0, 90, "a batch", runtime)

    def event(rid: str, ts: int, rng: random.Random) -> Sent:
        key = rng.choice(KEYS)
        return rid, key, json.dumps({"k": key, "id": rid}).encode(), ts

    rng = random.Random(17)
    sent = _send_bursts(kafka_bootstrap, topic, "id", event, rng)
    sent.append(("bad-1", "x", b"not json", now_ms()))  # key extraction fails
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(
        topic, key="x", value=b"not json", headers=[("id", b"bad-1")], timestamp=sent[-1][3]
    )
    assert producer.flush(10) == 0

    driver = TopologyTestDriver(topology, start_ms=sent[0][3])
    _drive(driver, "events", sent)
    expected_counts = _triples(driver.output("counts"))
    expected_totals = _triples(driver.output("totals"))
    assert len(expected_totals) >= 3, expected_totals  # the bursts span several windows
    # The driver against what was sent, computed independently of millstream.
    truth_counts, truth_totals = _ground_truth(sent)
    assert _decoded(expected_counts) == truth_counts
    assert _decoded(expected_totals) == truth_totals

    last = max(ts for _, _, ts in expected_totals)
    wait_until(
        lambda: _published(redis_client, app, "total") > last,
        90,
        f"the last stage's watermark to pass {last}",
        runtime,
    )
    runtime_totals = _topic_triples(
        kafka_bootstrap, topology.topic_of("totals"), len(expected_totals)
    )
    assert runtime_totals == expected_totals
    assert _decoded(runtime_totals) == truth_totals
    runtime_counts = _topic_triples(
        kafka_bootstrap, topology.topic_of("counts"), len(expected_counts)
    )
    assert runtime_counts == expected_counts
    assert _decoded(runtime_counts) == truth_counts  # the runtime against ground truth too

    # Same dead letter (its position differs: a topic partition here, offset 0 in the driver).
    [letter] = read_topic(kafka_bootstrap, topology.topic_of("dead-letters"), expected=1)
    [expected_letter] = driver.dead_letters()
    fields = ("computation", "key", "error", "record_id", "value", "timestamp", "stream")
    runtime_body, driver_body = json.loads(letter.value()), json.loads(expected_letter.value)
    assert {f: runtime_body[f] for f in fields} == {f: driver_body[f] for f in fields}

    for name in ("count", "total"):
        assert metric(redis_client, app, name, "late") == driver.late(name) == 0
    assert (
        metric(redis_client, app, "count", "duplicates")
        == driver.metrics("count")["duplicates"]
        == 9
    )


# --- the example pipeline, as `millstream run` runs it ---------------------------------------


def _file_sink_triples(folder: Path) -> set[tuple[str, bytes, int]]:
    out = set()
    for path in folder.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out.add((row["key"], row["value"].encode(), row["timestamp"]))
    return out


def test_the_example_pipeline_runs_and_writes_what_its_unit_test_driver_predicts(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    from examples.page_views.pipeline import build

    app = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    output = tmp_path / "page_views"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MILLSTREAM_", "PAGE_VIEWS_"))}
    env.update(
        REDIS_URL=redis_url,
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        MILLSTREAM_APP=app,
        MILLSTREAM_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
        MILLSTREAM_STATE_DIR=str(tmp_path / "state"),
        MILLSTREAM_SHARDS="2",
        MILLSTREAM_TRIGGER_MS="300",
        MILLSTREAM_LOG_LEVEL="WARNING",
        PAGE_VIEWS_TOPIC=topic,
        PAGE_VIEWS_OUTPUT=str(output),
        PAGE_VIEWS_WINDOW_MS=str(WINDOW_MS),
        PAGE_VIEWS_APP=app,
    )
    pipeline = PipelineProcess.run_target(
        "examples.page_views.pipeline:topology", env, tmp_path / "pipeline.log", cwd=ROOT
    )
    with pipeline:
        pipeline.start()
        pipeline.wait_for(
            lambda: _published(redis_client, app, "page_counter#input") > 0, 150, "a batch"
        )

        def view(rid: str, ts: int, rng: random.Random) -> Sent:
            page = rng.choice(["/home", "/cart", "/faq", "/blog", "/about"])
            return (
                rid,
                None,
                json.dumps({"page": page, "user": f"u{rng.randrange(9)}"}).encode(),
                ts,
            )

        sent = _send_bursts(kafka_bootstrap, topic, "view-id", view, random.Random(23))
        driver = TopologyTestDriver(build(window_ms=WINDOW_MS, app=app), start_ms=sent[0][3])
        _drive(driver, "page_views", sent)
        expected = _triples(driver.output("top_pages"))
        assert len(expected) >= 3 and driver.dead_letters() == []

        last = max(ts for _, _, ts in expected)
        pipeline.wait_for(
            lambda: _published(redis_client, app, "top_pages") > last, 90, f"top_pages past {last}"
        )
        counters = {
            (name, counter): metric(redis_client, app, name, counter)
            for name in ("page_counter", "top_pages")
            for counter in ("records", "late", "dead_letters", "duplicates", "timers_fired")
        }
        assert _file_sink_triples(output) == expected, (counters, pipeline.log_tail())
        assert pipeline.stop() == 0, pipeline.log_tail()
