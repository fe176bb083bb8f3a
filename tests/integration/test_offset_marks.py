"""Records whose ids are their Kafka position, through real shard tasks on a real Redis: a
replayed batch is dropped by the offset marks (no catalog entry per record), an application
upgraded from catalog-only dedup finds its last batch's ids, ids of their own still go to the
catalog, and a rescale after a batch only some old shards committed applies each record once
(a merge joins a shard that committed with one that had not; a split copies)."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.connectors.plan import BatchPlan
from millstream.connectors.routing import route
from millstream.connectors.shard_task import run_shard
from millstream.injectors.record_ids import derived_id
from millstream.state.catalog import read_bucket
from millstream.state.catalog_entries import ENTRY_BYTES
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.rescale import move
from millstream.state.shard import ShardConfig, acknowledge
from millstream.state.shard_count import ShardLayout, record_layout
from millstream.state.watermarks import Watermark

T0 = 1_700_000_000_000
TOPIC = "page-views"
BUCKET_MS = 600_000


class Count(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def _spec(app: str, shards: int, id_header: str | None = None, exactly_once: bool = True) -> Any:
    topology = Topology(app).source("views", kafka_source(TOPIC, id_header=id_header))
    topology.computation(
        "count", Count(), inputs={"views": json_field("k")}, shards=shards,
        exactly_once=exactly_once,
    )  # fmt: skip
    return topology.computations["count"]


def _rows(first: int, n: int, rng: random.Random, own_ids: bool = False) -> list[tuple]:
    """`n` records per partition 0 and 1 from offset `first`, keys k0..k29 in JSON values;
    one in ten not JSON (its key cannot be read: a dead letter, routed by its id)."""
    rows = []
    for partition in (0, 1):
        for offset in range(first, first + n):
            key = f"k{rng.randrange(30)}"
            value = b"not json" if rng.random() < 0.1 else json.dumps({"k": key}).encode()
            rid = rng.randbytes(16) if own_ids else derived_id(TOPIC, partition, offset)
            ts = T0 + offset
            rows.append(("views", rid, None, value, ts, ts, TOPIC, partition, offset, None, None))
    return rows


def _run(
    url: str,
    app: str,
    spec: Any,
    layout: ShardLayout,
    batch: int,
    rows: list[tuple],
    only: set[int] | None = None,
) -> Counter[str]:
    """One batch of `rows` through every shard (or the shards in `only`); summed counters."""
    plan = BatchPlan(
        app=app, batch_id=batch, redis_url=url, shards=layout.shards,
        shard_config=ShardConfig(bucket_ms=BUCKET_MS), input_watermark=Watermark(T0, T0),
        gc_watermark=0, now=T0, user_retries=0, fail_stop=True, internal_inputs=frozenset(),
        deliveries={}, in_flight_streams=frozenset(), generation=layout.generation,
    )  # fmt: skip
    by_shard: dict[int, list[Any]] = {}
    for shard, item in route(dict(spec.inputs), layout.shards, iter(rows), spec.formats):
        by_shard.setdefault(shard, []).append(item)
    counters: Counter[str] = Counter()
    client = connect(url)
    for shard, items in sorted(by_shard.items()):
        if only is None or shard in only:
            result = run_shard(plan, spec, shard, items)
            counters.update(result.counters)
            if result.lease is not None:  # dead letters: delivered and acknowledged, as the
                keys = ShardKeys(app, "count", shard, layout.generation)  # driver would
                acknowledge(client, keys, result.lease, result.outstanding, {}, result.outstanding)
    return counters


def _counts(client: Any, app: str, layout: ShardLayout) -> dict[str, int]:
    out: dict[str, int] = {}
    for keys in layout.keys(app, "count"):
        for key, raw in client.hgetall(keys.state).items():
            out[key.decode()] = json.loads(raw)
    return out


def _truth(*batches: list[tuple]) -> dict[str, int]:
    good = [json.loads(r[3])["k"] for rows in batches for r in rows if r[3] != b"not json"]
    return dict(Counter(good))


def _dead_letters(client: Any, app: str, layout: ShardLayout) -> int:
    return sum(int(client.hget(k.counters, "dead_letters") or 0) for k in layout.keys(app, "count"))


def _bad(*batches: list[tuple]) -> int:
    return sum(r[3] == b"not json" for rows in batches for r in rows)


def _catalog_entries(client: Any, app: str, layout: ShardLayout) -> int:
    total = 0
    for keys in layout.keys(app, "count"):
        for _, bucket in client.zrange(keys.buckets, 0, -1, withscores=True):
            blobs = read_bucket(client, keys, int(bucket))
            total += sum(len(b) for b in blobs) // ENTRY_BYTES
    return total


def test_replays_are_dropped_by_offset_marks_without_catalog_entries(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    app, rng = redis_namespace, random.Random(1)
    layout = ShardLayout(4, 0)
    spec = _spec(app, 4)
    one, two = _rows(0, 100, rng), _rows(100, 150, rng)
    first = _run(redis_url, app, spec, layout, 1, one)
    # No mark yet: the first batch per partition is the catalog's (an upgraded application's
    # last batch may be there), and it sets the marks.
    assert first["offset_marked"] == 0 and _catalog_entries(redis_client, app, layout) == 200
    again = _run(redis_url, app, spec, layout, 1, one)
    assert again["replays"] == 200 and again["offset_marked"] == 200
    second = _run(redis_url, app, spec, layout, 2, two)
    assert second["offset_marked"] == 300 and second.get("replays", 0) == 0
    assert _run(redis_url, app, spec, layout, 2, two)["replays"] == 300
    assert _counts(redis_client, app, layout) == _truth(one, two)
    # The marked records entered no catalog: still the first batch's 200 entries only.
    assert _catalog_entries(redis_client, app, layout) == 200
    marks = [redis_client.hlen(k.offset_marks) for k in layout.keys(app, "count")]
    assert sum(marks) == 8  # 4 shards x 2 partitions, a field each


def test_ids_of_their_own_still_go_to_the_catalog(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    app, rng = redis_namespace, random.Random(2)
    layout = ShardLayout(2, 0)
    spec = _spec(app, 2, id_header="event-id")
    rows = _rows(0, 50, rng, own_ids=True)
    _run(redis_url, app, spec, layout, 1, rows)
    again = _run(redis_url, app, spec, layout, 1, rows)
    assert again["replays"] == 100 and again["offset_marked"] == 0
    assert _catalog_entries(redis_client, app, layout) == 100
    assert _counts(redis_client, app, layout) == _truth(rows)


@pytest.mark.parametrize("id_header", [None, "event-id"])
def test_without_exactly_once_nothing_is_deduplicated_or_remembered(
    redis_url: str, redis_client: Any, redis_namespace: str, id_header: str | None
) -> None:
    """exactly_once=False: at least once, no dedup at all; a replay applies again, and no
    catalog entry or offset mark is written for records nothing will look up."""
    app, rng = redis_namespace, random.Random(4)
    layout = ShardLayout(2, 0)
    spec = _spec(app, 2, id_header=id_header, exactly_once=False)
    rows = _rows(0, 60, rng, own_ids=id_header is not None)
    first = _run(redis_url, app, spec, layout, 1, rows)
    again = _run(redis_url, app, spec, layout, 1, rows)
    for counters in (first, again):
        assert counters.get("replays", 0) == 0 and counters.get("offset_marked", 0) == 0
    doubled = {k: 2 * n for k, n in _truth(rows).items()}
    assert _counts(redis_client, app, layout) == doubled
    assert _catalog_entries(redis_client, app, layout) == 0
    assert sum(redis_client.hlen(k.offset_marks) for k in layout.keys(app, "count")) == 0


def test_a_merge_after_a_batch_one_old_shard_had_not_committed_applies_it_once(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    app, rng = redis_namespace, random.Random(3)
    old = record_layout(redis_client, app, "count", 2)
    spec = _spec(app, 2)
    one, two, three = _rows(0, 80, rng), _rows(80, 80, rng), _rows(160, 80, rng)
    _run(redis_url, app, spec, old, 1, one)
    _run(redis_url, app, spec, old, 2, two)  # marks from the offset path now
    _run(redis_url, app, spec, old, 3, three, only={0})  # shard 1 crashed before its commit
    merged = move(redis_client, app, "count", old, 1)
    fields = redis_client.hgetall(merged.keys(app, "count")[0].offset_marks)
    assert len(fields) == 4 and all(b"/2:" in f for f in fields)  # inherited, qualified
    replay = _run(redis_url, app, spec, merged, 3, three)  # Spark re-runs batch 3
    assert replay["replays"] == sum(1 for r in three if _shard(r, 2) == 0)
    assert _counts(redis_client, app, merged) == _truth(one, two, three)
    assert _dead_letters(redis_client, app, merged) == _bad(one, two, three)  # each once
    four = _rows(240, 80, rng)
    _run(redis_url, app, spec, merged, 4, four)
    assert _counts(redis_client, app, merged) == _truth(one, two, three, four)
    # The merged shard's own mark passed both inherited ones: they are gone.
    fields = redis_client.hgetall(merged.keys(app, "count")[0].offset_marks)
    assert len(fields) == 2 and not any(b"/" in f for f in fields)
    split = move(redis_client, app, "count", merged, 3)
    assert _run(redis_url, app, spec, split, 4, four)["replays"] == len(four)
    assert _counts(redis_client, app, split) == _truth(one, two, three, four)
    assert _dead_letters(redis_client, app, split) == _bad(one, two, three, four)


def _shard(row: tuple, shards: int) -> int:
    """The shard routing gives the row (by its key, or by its id when it has none)."""
    from millstream.state.keys import shard_of

    if row[3] == b"not json":
        return shard_of(row[1].hex(), shards)
    return shard_of(json.loads(row[3])["k"], shards)


def test_the_marks_are_the_shards_own_keys(redis_namespace: str) -> None:
    keys = ShardKeys(redis_namespace, "count", 3)
    assert keys.offset_marks.startswith(keys.tag)
