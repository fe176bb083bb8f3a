"""`join recover --abandon` on a real Redis: a pipeline's clicks in flight are released only
when no live copy of it holds the application, and only that pipeline's (millstream/join_tools.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from confluent_kafka import KafkaError

from millstream import join_tools
from millstream.errors import ConfigurationError
from millstream.state import holder, replay
from millstream.state.client import connect
from millstream.state.registry import Claim, IdRegistry
from millstream.state.watermarks import now_ms
from tests.e2e.join_target import build

FENCED_OR_UNANSWERED = (
    KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError._TIMED_OUT,
)  # fmt: skip


def _setup(redis_url: str, ns: str) -> tuple[Any, IdRegistry, join_tools.Verdicts, dict]:
    a, b = f"{ns}-a", f"{ns}-b"
    topology = build(b, "clicks", "queries", f"reg-{ns}", 100, None)
    registry = IdRegistry(connect(redis_url), f"reg-{ns}")
    at = now_ms()
    clicks = {f"c{i}": join_tools.Click(f"c{i}", at, None, b'{"click_id": "c%d"}' % i)
              for i in range(4)}  # fmt: skip
    tokens = {"c0": f"{a}|joiner|0|aa", "c1": f"{a}|joiner|1|bb", "c2": f"{b}|joiner|0|cc",
              "c3": f"{a}|joiner|0|dd"}  # fmt: skip
    registry.insert([Claim(c, at, t) for c, t in tokens.items()])
    verdicts = join_tools.Verdicts(
        clicks=4,
        in_flight=[(c, tokens[c]) for c in ("c0", "c1", "c2")],
        orphaned=[("c3", tokens["c3"])],
    )
    return topology, registry, verdicts, clicks


def test_abandon_is_refused_while_the_pipeline_runs_then_releases_only_its_clicks(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    topology, registry, verdicts, clicks = _setup(redis_url, redis_namespace)
    a, b = f"{redis_namespace}-a", f"{redis_namespace}-b"
    assert verdicts.in_flight_by_app() == {a: 2, b: 1}
    # A live copy of A (this process, a fresh heartbeat): refused, nothing released.
    me = holder.Holder.this_process()
    assert holder.claim(redis_client, a, me) is None
    assert join_tools.running(redis_url, a) is not None
    with pytest.raises(ConfigurationError, match="is running"):
        join_tools.recover(topology, verdicts, clicks, b, redis_url, abandon=a)
    with pytest.raises(ConfigurationError, match="another pipeline"):
        join_tools.recover(topology, verdicts, clicks, a, redis_url, abandon=a)
    at = clicks["c0"].timestamp
    assert all(registry.holders([(c, at) for c in clicks]))
    assert replay.queued(redis_client, b) == 0

    # A's heartbeat lapsed (a host that went away): its holder stays, but it is not running.
    lapsed = dataclasses.replace(me, host="a-lost-host")
    holder.release(redis_client, a, me)
    holder.claim(redis_client, a, lapsed, ttl_ms=holder.TTL_MS)
    redis_client.hset(holder.holder_key(a), "beat", now_ms() - holder.TTL_MS - 1)
    assert join_tools.running(redis_url, a) is None
    done = join_tools.recover(topology, verdicts, clicks, b, redis_url, abandon=a)
    assert done == {"orphans": 1, "abandoned": 2, "fenced": 0, "released": 3, "requeued": 3,
                    "requeued_before": 0}  # fmt: skip
    # A's two in flight and the orphan released; B's own click in flight untouched.
    held = dict(zip(clicks, registry.holders([(c, at) for c in clicks]), strict=True))
    assert held == {"c0": None, "c1": None, "c2": f"{b}|joiner|0|cc", "c3": None}
    assert replay.queued(redis_client, b) == 3


def test_without_abandon_only_orphans_are_released(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    topology, registry, verdicts, clicks = _setup(redis_url, redis_namespace)
    done = join_tools.recover(topology, verdicts, clicks, f"{redis_namespace}-b", redis_url)
    assert done["orphans"] == done["released"] == 1 and done["abandoned"] == 0
    at = clicks["c0"].timestamp
    assert [t is None for t in registry.holders([(c, at) for c in clicks])] == [
        False, False, False, True,
    ]  # fmt: skip


def test_abandon_fences_the_pipelines_transactional_outputs(
    redis_url: str, redis_namespace: str, kafka_bootstrap: str, kafka_topic_factory: Any
) -> None:
    """A paused process of the abandoned pipeline, its output transaction open, can no longer
    commit it once recover has run: every shard's transactional id is fenced."""
    from confluent_kafka import KafkaException, Producer

    from millstream.sinks.base import ShardRef
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink, transactional_id
    from millstream.state.shard_count import record_layout
    from millstream.testing.committed_reader import read_committed

    topology, _, verdicts, clicks = _setup(redis_url, redis_namespace)
    a, b = f"{redis_namespace}-a", f"{redis_namespace}-b"
    out = kafka_topic_factory(partitions=1)
    topology.sink("joined", KafkaTransactionalSink(topic=out))
    record_layout(connect(redis_url), a, "joiner", 2)  # A ran with 2 joiner shards
    paused = Producer({"bootstrap.servers": kafka_bootstrap,
                       "transactional.id": transactional_id(ShardRef(a, "joiner", 1))})  # fmt: skip
    paused.init_transactions(30)
    paused.begin_transaction()
    paused.produce(out, b"registered before the release")
    assert paused.flush(10) == 0
    kafka = {"bootstrap.servers": kafka_bootstrap}
    done = join_tools.recover(topology, verdicts, clicks, b, redis_url, abandon=a, kafka=kafka)
    assert done["fenced"] == 2 and done["abandoned"] == 2
    with pytest.raises(KafkaException) as raised:
        paused.commit_transaction(5)
    # Apache Kafka answers a fenced producer's EndTxn with PRODUCER_FENCED; the embedded broker
    # leaves it unanswered. Either way the transaction was aborted by the fence: not visible.
    assert raised.value.args[0].code() in FENCED_OR_UNANSWERED, raised.value
    assert [r.value for r in read_committed(kafka_bootstrap, out)] == []


def test_verify_finds_a_rescaled_joiners_checkpoints_and_waiting_clicks(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    """After `millstream rescale` of a joiner, its shards live under the new layout's keys:
    a click in flight there is in flight (not an orphan to release), a waiting one waiting."""
    from millstream.state.keys import ShardKeys, shard_of
    from millstream.state.shard_count import ShardLayout, shard_counts_key

    a = f"{redis_namespace}-a"
    layout = ShardLayout(3, 2)  # rescaled twice: 3 shards under generation 2's keys
    redis_client.hset(shard_counts_key(a), "joiner", layout.encode())
    production = bytes.fromhex("ab" * 8)
    held = ShardKeys(a, "joiner", 1, layout.generation)
    redis_client.hset(held.productions, production, b"checkpoint")
    token = f"{a}|joiner|1|{production.hex()}"
    stale = f"{a}|joiner|2|{'cd' * 8}"  # an older layout's token: its checkpoint is gone
    assert join_tools._checkpointed(redis_client, [token, stale]) == {token}
    waiting = ShardKeys(a, "joiner", shard_of("c9", 3), layout.generation)
    redis_client.hset(waiting.state, "c9", b"{}")
    assert join_tools._waiting(redis_client, a, "joiner", "c9")
    assert not join_tools._waiting(redis_client, a, "joiner", "c8")
