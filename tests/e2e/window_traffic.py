"""Traffic and checks shared by the end-to-end runs of `tests.e2e.cluster_target` (the cluster
test, the rescale test): events with 5% sent twice, ground truth by arithmetic, the drain to
the last window, and every window's count checked in state and in the sink's topic."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from millstream.state.watermarks import WatermarkAuthority
from millstream.status import committed_counters
from millstream.testing.committed_reader import read_committed, read_raw_topic, record_origins
from millstream.testing.process import PipelineProcess
from tests.e2e.cluster_target import WINDOW
from tests.e2e.conftest import shard_states
from tests.e2e.sink_faults import pipeline_sink_lines

KEYS = 16
PARTITIONS = 8

Event = tuple[str, str, int]  # id, key, timestamp


def send(producer: Producer, topic: str, rng: random.Random, events: list[Event], n: int) -> None:
    """n events stamped now (up to 800 ms out of order), 5% of them sent twice."""
    now = int(time.time() * 1000)
    fresh = [
        (f"e{i}", f"k{rng.randrange(KEYS)}", now - rng.randrange(800))
        for i in range(len(events), len(events) + n)
    ]
    for event_id, key, ts in fresh + rng.sample(fresh, max(1, n // 20)):
        producer.produce(
            topic, key=key, value=json.dumps({"e": event_id, "k": key}),
            headers=[("id", event_id.encode())], timestamp=ts,
            partition=rng.randrange(PARTITIONS),
        )  # fmt: skip
    assert producer.flush(10) == 0
    events.extend(fresh)


def truth_of(events: list[Event]) -> dict[str, dict[str, int]]:
    """Per key, every 1 s window's count, by arithmetic."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    size = WINDOW.size_ms
    for _, key, ts in events:
        window = f"{ts - ts % size}|{ts - ts % size + size}"
        out[key][window] = out[key].get(window, 0) + 1
    return dict(out)


def drain(
    pipeline: PipelineProcess,
    producer: Producer,
    topic: str,
    rng: random.Random,
    events: list[Event],
    authority: WatermarkAuthority,
    collected: Callable[[], int],
) -> dict[str, dict[str, int]]:
    """Send the last events, wait for every window's count and for both stages' watermarks to
    pass the last window; returns the ground truth."""
    for _ in range(4):
        send(producer, topic, rng, events, 40)
        time.sleep(0.5)
    truth = truth_of(events)
    expected = sum(len(w) for w in truth.values())
    last_end = max(int(w.split("|")[1]) for windows in truth.values() for w in windows)

    def done() -> bool:
        marks = [authority.published(c) for c in ("tumbling", "collector")]
        return collected() >= expected and all(m and m.event > last_end for m in marks)

    pipeline.wait_for(done, 180, f"{expected} window counts and every watermark past")
    time.sleep(2.0)  # a (wrong) second delivery would land by now
    return truth


def check(
    client: Any,
    app: str,
    bootstrap: str,
    output: str,
    events: list[Event],
    truth: dict[str, dict[str, int]],
    shards: int,
    duplicates: int = 1,
    pipeline: PipelineProcess | None = None,
) -> dict[str, Any]:
    """Every window's count in the collector's state and in the sink's topic (read_committed),
    each once; every record counted, at least `duplicates` recognised; no window left open.
    Returns the collector's states. A window delivered twice fails with where every copy sits
    in the raw log and, given `pipeline`, its log lines about deliveries."""
    states = shard_states(client, app, "collector", shards)
    assert {k: s["windows"] for k, s in states.items()} == truth
    assert all(s["again"] == [] for s in states.values()), "a window count arrived twice"
    counters = committed_counters(client, app, "tumbling", shards)
    assert counters.get("records") == len(events), counters
    assert counters.get("duplicates", 0) >= duplicates, counters
    assert counters.get("late", 0) == 0 and counters.get("dead_letters", 0) == 0, counters
    assert shard_states(client, app, "tumbling", shards) == {}  # every window closed
    delivered: dict[str, dict[str, int]] = defaultdict(dict)
    twice = []
    for record in read_committed(bootstrap, output):
        body = json.loads(record.value or b"")
        if body["w"] in delivered[body["k"]]:
            twice.append(body)
        delivered[body["k"]][body["w"]] = body["n"]
    if twice:
        lines = pipeline_sink_lines(pipeline) if pipeline is not None else []
        story = "\n".join([*doubled_story(bootstrap, output, twice), *lines])
        raise AssertionError(f"{len(twice)} window counts delivered twice: {twice[:5]}\n{story}")
    assert dict(delivered) == truth
    return states


def doubled_story(bootstrap: str, topic: str, twice: list[dict[str, Any]]) -> list[str]:
    """Every raw copy of each doubled window in `topic`: partition, offset, producer id and
    epoch, its transaction's marker and the production id header, so that a failure says
    whether one production was delivered twice (one id) or two were made (two ids)."""
    try:
        partitions = read_raw_topic(bootstrap, topic)
    except Exception as exc:
        return [f"raw log unreadable: {type(exc).__name__}: {exc}"]
    wanted = {(t["k"], t["w"]) for t in twice[:10]}
    lines = []
    for partition, batches in enumerate(partitions):
        ids, sequences = {}, {}
        for batch in batches:
            for index, record in enumerate(() if batch.control else batch.records):
                ids[record.offset] = dict(record.headers or ()).get("ms-id", b"?")
                sequences[record.offset] = batch.base_sequence + index
        for offset, origin in sorted(record_origins(partition, batches).items()):
            body = json.loads(origin.value or b"{}")
            if (body.get("k"), body.get("w")) in wanted:
                # Two copies with one producer id, epoch and sequence: the broker wrote a
                # retried produce twice (an idempotent producer's retry is deduplicated by it).
                lines.append(
                    f"{body['k']} {body['w']} n={body.get('n')}: p{partition}@{offset} pid "
                    f"{origin.producer_id} epoch {origin.producer_epoch} sequence "
                    f"{sequences.get(offset)} marker {origin.marker!r} id {ids.get(offset)!r}"
                )
    return sorted(lines)
