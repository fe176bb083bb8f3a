"""Zombie and speculative shard tasks against real Redis and Kafka.

spark.speculation cannot be switched on in the running test session (and local[N] masters never
speculate), so the zombie is emulated the way Spark would produce one: the same shard task of
the same micro-batch (the same BatchPlan, built by the fused runner's own `_plan`, and the same
rows, routed by its own `route`) runs in two separate Python processes, like a task attempt and
its speculative copy in two Python workers. The first attempt stalls inside user code after
acquiring the shard; the copy acquires it (fencing the first) and commits; the driver settles
the copy's result; then the first attempt wakes up. Its commit must write nothing, and its
re-acquire fences the copy's lease, so the driver's acknowledgement under it is refused and the
checkpoints stay until the shard's next batch delivers and acknowledges them. State and output
must equal ground truth, each output under one id.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections import Counter
from typing import Any

import pytest

from millstream import Computation, Context, FencedError, Record, Topology, json_field
from millstream.connectors.fused import FusedRunner
from millstream.connectors.plan import TaskInput
from millstream.connectors.routing import route, route_stage
from millstream.connectors.settlement import Done, hand_over
from millstream.connectors.shard_task import run_shard
from millstream.connectors.targets import Endpoints
from millstream.connectors.topics import ensure_topics
from millstream.headers import HEADER_ID
from millstream.injectors.sources import kafka_source
from millstream.records import Production, TimeDomain
from millstream.settings import Settings
from millstream.state.catalog import Verdict, read_bucket
from millstream.state.catalog_entries import ENTRY_BYTES
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.transaction import TransactionStatus
from millstream.state.watermarks import NONE_KNOWN, now_ms
from tests.e2e.conftest import read_topic, shard_states

SHARDS = 2
ROLE_ENV = "MILLSTREAM_E2E_ZOMBIE_ROLE"


class StallingCounter(Computation):
    """Counts events per key and emits the running count; in the process playing the zombie,
    the first call stalls until the test releases it (a GC pause, a lost network, a slow disk)."""

    def __init__(self, redis_url: str, gate: str) -> None:
        self.redis_url = redis_url
        self.gate = gate

    def process_record(self, ctx: Context, record: Record) -> None:
        if os.environ.get(ROLE_ENV) == "zombie":
            client = connect(self.redis_url)
            if client.set(f"{self.gate}:stalled", 1, nx=True):
                deadline = time.monotonic() + 60
                while not client.exists(f"{self.gate}:release"):
                    if time.monotonic() > deadline:
                        raise TimeoutError("the test never released the zombie")
                    time.sleep(0.02)
        count = ctx.get_state(0) + 1
        ctx.set_state(count)
        body = json.loads(record.value)
        ctx.produce("counts", ctx.key, {"k": ctx.key, "n": count, "e": body["e"]})


class Tally(Computation):
    """Stage B: the events each key's running counts arrived for (a second arrival of an
    event is recorded under "again")."""

    def process_record(self, ctx: Context, record: Record) -> None:
        event = json.loads(record.value)["e"]
        state = ctx.get_state({"events": [], "again": []})
        state["again" if event in state["events"] else "events"].append(event)
        ctx.set_state(state)


def _shard_worker(payload: bytes, role: str, results: Any) -> None:
    """One shard task attempt in its own process, as in a Spark Python worker."""
    from pyspark import cloudpickle

    os.environ[ROLE_ENV] = role
    plan, spec, shard, items = cloudpickle.loads(payload)
    try:
        result = run_shard(plan, spec, shard, items)
    except Exception as exc:
        results.put((role, "error", repr(exc), {}, None))
    else:
        results.put((role, "ok", result.fenced_retries, result.counters, result))


def _injected_rows(messages: list[Any], stream: str, id_header: str) -> list[tuple]:
    """The rows the Kafka injector emits for these records (INJECTED_SCHEMA column order)."""
    rows = []
    for m in messages:
        headers = m.headers() or []
        _kind, stamp = m.timestamp()
        rid = dict(headers)[id_header]
        rows.append(
            (
                stream,
                rid,
                m.key(),
                m.value(),
                stamp,
                stamp,
                m.topic(),
                m.partition(),
                m.offset(),
                headers,
                None,
            )
        )
    return rows


def test_zombie_shard_attempt_is_fenced_and_applies_nothing(
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
    redis_url: str,
) -> None:
    from confluent_kafka import Producer
    from pyspark import cloudpickle

    rng = random.Random(5)
    app_name = redis_namespace
    topic = kafka_topic_factory(partitions=2)
    gate = f"{app_name}:gate"
    topology = Topology(app_name)
    topology.source("events", kafka_source(topic, id_header="eid"))
    topology.computation(
        "counter",
        StallingCounter(redis_url, gate),
        inputs={"events": json_field("k")},
        outputs=["counts"],
        shards=SHARDS,
    )
    # Stage B in the same fused query: `counts` is handed to it inside the batch (and, being
    # published, also written to its topic for the output checks below).
    topology.computation("tally", Tally(), inputs={"counts": json_field("k")}, shards=SHARDS)
    topology.publish("counts")
    spec = topology.computations["counter"]
    settings = Settings(
        redis_url=redis_url, kafka_bootstrap_servers=kafka_bootstrap, app=app_name, shards=SHARDS
    )
    endpoints = Endpoints(redis_url=redis_url, kafka={"bootstrap.servers": kafka_bootstrap})
    ensure_topics(endpoints.kafka, {topology.topic_of(s): 4 for s in topology.internal_streams()})

    # Real input: 5% of the events sent twice, through either partition.
    events = [(f"e{i}", f"k{rng.randrange(10)}") for i in range(80)]
    sent = events + rng.sample(events, 4)
    rng.shuffle(sent)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for event_id, key in sent:
        producer.produce(
            topic,
            key=key,
            value=json.dumps({"e": event_id, "k": key}),
            headers=[("eid", event_id.encode())],
            partition=rng.randrange(2),
        )
    assert producer.flush(10) == 0
    messages = read_topic(kafka_bootstrap, topic, expected=len(sent))
    assert len(messages) == len(sent)
    truth = Counter(key for _, key in events)

    # One micro-batch, planned and routed as the fused runner does it.
    runner = FusedRunner(topology, settings, endpoints)
    stage = runner.stages["counter"]
    tally = runner.stages["tally"]

    def plan_batch(batch_id: int) -> Any:
        input_wm = runner.watermarks.input(stage, runner.watermarks.injected(), {})
        return runner._plan(stage, batch_id, input_wm, now_ms())

    def run_tally(batch_id: int, results: list[Any]) -> dict[str, int]:
        """Stage B of the batch: A's results handed over, routed, run, settled."""
        handed: dict[str, list[tuple]] = {}
        hand_over(stage, plan, results, handed)
        inputs = route_stage(tally, {}, handed)
        b_plan = runner._plan(tally, batch_id, NONE_KNOWN, now_ms())
        counters: Counter[str] = Counter()
        for shard, items in inputs.items():
            counters.update(run_shard(b_plan, tally.spec, shard, items).counters)
        return dict(counters)

    plan = plan_batch(0)
    by_shard: dict[int, list[TaskInput]] = {s: [] for s in range(SHARDS)}
    rows = _injected_rows(messages, "events", "eid")
    for shard, item in route(dict(spec.inputs), SHARDS, iter(rows)):
        by_shard[shard].append(item)
    victim = max(by_shard, key=lambda s: len(by_shard[s]))
    victim_keys = {item.key for item in by_shard[victim]}
    unique_in_victim = len({item.row[1] for item in by_shard[victim]})
    keys = ShardKeys(app_name, "counter", victim)
    payload = cloudpickle.dumps((plan, spec, victim, by_shard[victim]))

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    zombie = context.Process(target=_shard_worker, args=(payload, "zombie", results))
    zombie.start()
    try:
        deadline = time.monotonic() + 60
        while not redis_client.exists(f"{gate}:stalled"):
            assert zombie.is_alive(), "the first attempt died before it stalled"
            assert time.monotonic() < deadline, "the first attempt never reached user code"
            time.sleep(0.05)
        assert int(redis_client.get(keys.sequencer)) == 1  # the first attempt holds the lease

        # The speculative copy: acquires (fencing the stalled attempt) and commits; the driver
        # takes its result (Spark keeps the first attempt to finish).
        copy = context.Process(target=_shard_worker, args=(payload, "copy", results))
        copy.start()
        copy.join(60)
        role, status, fenced_retries, counters, copy_result = results.get(timeout=5)
        assert (role, status, fenced_retries) == ("copy", "ok", 0), (role, status, counters)
        assert counters["records"] == unique_in_victim
        assert len(copy_result.outstanding) == unique_in_victim  # checkpointed, not yet acked
        state_after_copy = shard_states(redis_client, app_name, "counter", SHARDS)
        assert state_after_copy == {k: n for k, n in truth.items() if k in victim_keys}
        version_after_copy = int(redis_client.get(keys.version))
        assert int(redis_client.get(keys.sequencer)) == 2

        # Stage B takes the copy's productions and commits, before the zombie of A wakes.
        applied = run_tally(0, [copy_result])
        assert applied["records"] == unique_in_victim, applied

        # The zombie wakes up with stale state in hand and tries to commit.
        redis_client.set(f"{gate}:release", 1)
        zombie.join(60)
        role, status, fenced_retries, counters, _ = results.get(timeout=5)
    finally:
        for process in (zombie,):
            if process.is_alive():
                process.kill()
    # Its commit was rejected (FencedError inside run_shard), and its re-run from acquire
    # found every record already applied: replays, no new effects.
    assert (role, status, fenced_retries) == ("zombie", "ok", 1), (role, status, counters)
    assert counters.get("records", 0) == 0, counters
    assert counters["replays"] + counters.get("duplicates", 0) == len(by_shard[victim])
    assert shard_states(redis_client, app_name, "counter", SHARDS) == state_after_copy
    # The re-run committed only its metrics; no state write came from the stale attempt.
    assert int(redis_client.get(keys.version)) == version_after_copy + 1
    assert redis_client.hlen(keys.productions) == unique_in_victim

    # The driver settles the copy's result: delivered, but its lease was fenced by the zombie's
    # re-acquire, so the acknowledgement is refused and the checkpoints stay.
    settled = runner.settlement.finish([Done(stage, plan, copy_result)])
    assert settled["counter"].get("acks_fenced") == 1, settled
    assert redis_client.hlen(keys.productions) == unique_in_victim

    # The rest of the batch, by single owners: the whole state equals ground truth.
    rest = [run_shard(plan, spec, shard, by_shard[shard]) for shard in range(SHARDS)]
    rest = [r for r in rest if r.shard != victim]
    run_tally(0, rest)
    runner.settlement.finish([Done(stage, plan, r) for r in rest])
    assert shard_states(redis_client, app_name, "counter", SHARDS) == dict(truth)
    # The shard's next batch (no input: its pending checkpoints make it busy) hands them over
    # again, and B drops them as replays (same id, same position); then they are delivered
    # under the same ids and acknowledged.
    next_plan = plan_batch(1)
    again = run_shard(next_plan, spec, victim, [])
    assert len(again.outstanding) == unique_in_victim and again.redelivered == unique_in_victim
    replayed = run_tally(1, [again])
    assert replayed.get("records", 0) == 0 and replayed["replays"] == unique_in_victim, replayed
    settled = runner.settlement.finish([Done(stage, next_plan, again)])
    assert "acks_fenced" not in settled["counter"], settled
    assert redis_client.hlen(keys.productions) == 0
    # B applied every event exactly once, although A's zombie woke after B's commit.
    b_states = shard_states(redis_client, app_name, "tally", SHARDS)
    assert all(s["again"] == [] for s in b_states.values()), "B applied an event twice"
    assert {k: sorted(s["events"]) for k, s in b_states.items()} == {
        k: sorted(e for e, key in events if key == k) for k in truth
    }
    catalog = 0
    for shard in range(SHARDS):
        keys = ShardKeys(app_name, "counter", shard)
        for _, bucket in redis_client.zrange(keys.buckets, 0, -1, withscores=True):
            blobs = read_bucket(redis_client, keys, int(bucket))
            catalog += sum(len(blob) for blob in blobs) // ENTRY_BYTES
    assert catalog == len(events)

    # Output: one production per event, each under one id (the victim's delivered twice with
    # the same id and value: consumers drop the copy), never a second version of the same
    # logical output; per key the running counts are exactly 1..n.
    output = read_topic(
        kafka_bootstrap, topology.topic_of("counts"), expected=len(events) + unique_in_victim
    )
    by_id: dict[bytes, set[bytes]] = {}
    for message in output:
        by_id.setdefault(dict(message.headers())[HEADER_ID], set()).add(message.value())
    assert all(len(values) == 1 for values in by_id.values())
    bodies = [json.loads(next(iter(values))) for values in by_id.values()]
    assert len(bodies) == len(events)
    assert sorted(b["e"] for b in bodies) == sorted(e for e, _ in events)
    per_key: dict[str, list[int]] = {}
    for body in bodies:
        per_key.setdefault(body["k"], []).append(body["n"])
    assert {k: sorted(v) for k, v in per_key.items()} == {
        k: list(range(1, n + 1)) for k, n in truth.items()
    }


def test_commit_from_an_older_lease_raises_fenced_and_writes_nothing(
    redis_client: Any, redis_namespace: str
) -> None:
    """The lease at the store level: the older owner's commit raises FencedError to its caller
    and leaves state, catalog, timers and checkpointed productions as the newer owner wrote."""
    keys = ShardKeys(redis_namespace, "counter", 0)
    config = ShardConfig(bucket_ms=60_000)
    now = now_ms()
    record = (b"event-1", now, b"topic:0:17")

    def production(value: bytes) -> Production:
        return Production("counts", "k", value, now, os.urandom(16), now)

    # Two workers, each with its own soft state (as two Python worker processes have).
    old = ShardStore(redis_client, keys, config, cache=SoftStateCache())
    old.acquire()
    assert old.dedup([record], gc_watermark=0) == [Verdict.NEW]
    stale = old.begin()
    stale.set_state("k", b"1")
    stale.set_timer("k", "t", now + 1000, TimeDomain.EVENT)
    stale.add_ids([(old.bucket_of(now), record[0], record[2])])
    stale.checkpoint(production(b"from-the-zombie"))

    new = ShardStore(redis_client, keys, config, cache=SoftStateCache())
    new.acquire()
    assert new.dedup([record], gc_watermark=0) == [Verdict.NEW]  # nothing was committed yet
    fresh = new.begin()
    fresh.set_state("k", b"1")
    fresh.add_ids([(new.bucket_of(now), record[0], record[2])])
    fresh.checkpoint(production(b"from-the-owner"))
    new.commit(fresh)

    with pytest.raises(FencedError):
        old.commit(stale)
    assert stale.status is TransactionStatus.FENCED
    assert redis_client.hgetall(keys.state) == {b"k": b"1"}
    assert redis_client.zcard(keys.timers("event")) == 0
    checkpointed = redis_client.hvals(keys.productions)
    assert len(checkpointed) == 1 and b"from-the-owner" in checkpointed[0]
    assert int(redis_client.get(keys.version)) == 1

    # A third owner sees the id as applied once: the same delivery again is a replay, another
    # delivery of the same id a duplicate.
    third = ShardStore(redis_client, keys, config, cache=SoftStateCache())
    third.acquire()
    again = [record, (record[0], now, b"topic:1:3")]
    assert third.dedup(again, gc_watermark=0) == [Verdict.REPLAY, Verdict.DUPLICATE]
    # And the fenced owner stays fenced: a new transaction on its old lease fails too.
    with pytest.raises(FencedError):
        retry = old.begin()
        retry.set_state("k", b"2")
        old.commit(retry)
    assert redis_client.hgetall(keys.state) == {b"k": b"1"}
