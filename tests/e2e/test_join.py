"""Photon's join on the runtime (#28): two pipelines active-active against one IdRegistry.

Clicks name a query by id; queries arrive before their clicks (most), a few seconds after
them (some: the clicks wait and retry) or never (a few: the clicks go unjoined after the
give-up time). Some clicks are sent twice with their record id (the catalog drops them) and
some again under a new record id (the same click id: the registry lets one through). Two
applications with their own names and checkpoints read the same topics and share the registry;
one is stopped mid-run and never restarted, the other carries the rest.

Against ground truth computed from what was sent: the union of both applications' joined
outputs holds every click whose query was sent exactly once (by production id first, as a
consumer deduplicates, then by click id), with the right joined value; each click is
registered to the application whose output holds it; clicks whose query never came are
unjoined; the registry races were lost and counted, never output.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.headers import HEADER_ID
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.registry import IdRegistry
from millstream.state.watermarks import WatermarkAuthority, now_ms
from millstream.state.wire import decode_production
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import metric, read_topic, wait_until
from tests.e2e.join_target import build
from tests.e2e.sink_faults import ROOT, pipeline_env

pytestmark = pytest.mark.spark

CLICKS, QUERIES = 240, 160


def _join_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "millstream.cli", "join", args[0], "tests.e2e.join_target:topology",
         *args[1:]],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _ran_a_batch(client: Any, app: str) -> Any:
    authority = WatermarkAuthority(client, app)
    return lambda: authority.published("joiner#input") is not None


def _joined(bootstrap: str, topic: str) -> dict[bytes, tuple[str, dict, int]]:
    """Production id -> (click id, body, timestamp): a consumer's view, deduplicated by
    production id."""
    out = {}
    for message in read_topic(bootstrap, topic, expected=0, quiet_polls=4):
        pid = dict(message.headers() or [])[HEADER_ID]
        out[pid] = (message.key().decode(), json.loads(message.value()), message.timestamp()[1])
    return out


def test_two_pipelines_join_clicks_with_late_and_missing_queries_exactly_once(
    start_app: Any,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    redis_client: Any,
    redis_url: str,
) -> None:
    rng = random.Random(28)
    clicks_topic, queries_topic = kafka_topic_factory(partitions=2), kafka_topic_factory(2)
    registry = f"reg-{redis_namespace}"
    apps = (f"{redis_namespace}-a", f"{redis_namespace}-b")
    first, second = (start_app(build(a, clicks_topic, queries_topic, registry)) for a in apps)
    for app, running in zip(apps, (first, second), strict=True):
        wait_until(_ran_a_batch(redis_client, app), 90, "a batch", running)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})

    def send(topic: str, rid: str, body: dict[str, Any], ts: int) -> None:
        producer.produce(topic, value=json.dumps(body), headers=[("id", rid.encode())],
                         timestamp=ts, partition=rng.randrange(2))  # fmt: skip

    queries = {f"q{i}": f"text {i}" for i in range(QUERIES)}
    fate = {q: rng.choices(["before", "after", "never"], [80, 12, 8])[0] for q in queries}
    fate["q0"], fate["q1"] = "after", "never"  # each fate at least once
    clicks = {f"c{i}": f"q{rng.randrange(QUERIES)}" for i in range(CLICKS)}
    later: list[tuple[str, dict[str, Any]]] = []
    for start in range(0, CLICKS, 40):  # 40 clicks every 0.5 s, with their queries
        now = now_ms()
        chunk = list(clicks.items())[start : start + 40]
        for _click, query in chunk:
            body = {"query_id": query, "text": queries[query]}
            if fate[query] == "before" and (query, body) not in later:
                send(queries_topic, f"query-{query}-{start}", body, now - 50)
            elif fate[query] == "after":
                later.append((query, body))
        for click, query in chunk:
            body = {"click_id": click, "query_id": query}
            send(clicks_topic, f"click-{click}", body, now)
            if rng.random() < 0.05:
                send(clicks_topic, f"click-{click}", body, now)  # the same record again
            if rng.random() < 0.05:
                send(clicks_topic, f"click-{click}-again", body, now)  # same click, new id
        assert producer.flush(10) == 0
        if start == 120:
            first.stop()  # one pipeline gone mid-run, never restarted
        time.sleep(0.5)
    time.sleep(2.0)  # the late queries: a few seconds after their clicks
    for query, body in later:
        send(queries_topic, f"query-{query}-late", body, now_ms())
    assert producer.flush(10) == 0

    joinable = {c: q for c, q in clicks.items() if fate[q] != "never"}
    never = {c for c, q in clicks.items() if fate[q] == "never"}
    b = apps[1]

    def unjoined() -> set[str]:
        return {m.key().decode() for m in read_topic(kafka_bootstrap, f"{b}.unjoined",
                                                      expected=0, quiet_polls=2)}  # fmt: skip

    wait_until(lambda: never <= unjoined(), 120, "the unjoined clicks", second)
    outputs = {a: _joined(kafka_bootstrap, f"{a}.joined") for a in apps}
    by_click: dict[str, list[tuple[str, dict, int]]] = {}
    for app, joined in outputs.items():
        for click, body, ts in joined.values():
            by_click.setdefault(click, []).append((app, body, ts))
    missing, extra = set(joinable) - set(by_click), set(by_click) - set(joinable)
    assert not missing and not extra, (missing, extra)
    twice = {c: v for c, v in by_click.items() if len(v) > 1}
    assert not twice, twice  # at most once across both pipelines
    registered = IdRegistry(connect(redis_url), registry).holders(
        [(click, found[0][2]) for click, found in by_click.items()]
    )
    for (click, [(app, body, _)]), token in zip(by_click.items(), registered, strict=True):
        query = joinable[click]
        assert body == {"click": click, "query": query, "text": queries[query]}
        assert token is not None and token.startswith(f"{app}|joiner|"), (click, app, token)
    assert unjoined() == never  # given up: only the clicks whose query never came

    stats = {a: {n: metric(redis_client, a, "joiner", n) for n in
                 ("joined", "joined_on_retry", "lost_races", "registered", "retries", "unjoined")}
             for a in apps}  # fmt: skip
    print(stats)
    assert sum(s["registered"] for s in stats.values()) == len(joinable)
    assert sum(s["lost_races"] for s in stats.values()) > 0  # both joined; one output each
    assert stats[b]["joined_on_retry"] > 0 and stats[b]["retries"] > 0
    assert stats[apps[0]]["joined"] > 0  # the stopped one joined too before it went: raced


def test_a_sigkill_after_the_registry_insert_before_output_outputs_once_on_restart(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Any,
) -> None:
    """Photon's lost-output window: a joiner registered clicks and died before delivering
    them; `join verify` finds them in flight. One shard's checkpoints are then deleted (output
    lost after registration): verify names those clicks as orphans with their tokens.
    Restarted, the pipeline delivers the others under the same tokens (the registry answers
    "ours"); `join recover` releases the orphans and queues them again; in the end every click
    is output once and verify says exactly once."""
    app, registry = redis_namespace, f"reg-{redis_namespace}"
    clicks_topic, queries_topic = kafka_topic_factory(partitions=2), kafka_topic_factory(2)
    crashes = tmp_path / "crashes"
    env = pipeline_env(
        redis_url, kafka_bootstrap, app, tmp_path, JOIN_TARGET_CLICKS=clicks_topic,
        JOIN_TARGET_QUERIES=queries_topic, JOIN_TARGET_REGISTRY=registry,
        MILLSTREAM_TEST_CRASH_FILE=str(crashes),
    )  # fmt: skip
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    now = now_ms()
    clicks = {f"c{i}": f"q{i % 40}" for i in range(120)}
    for q in sorted(set(clicks.values())):
        producer.produce(queries_topic, value=json.dumps({"query_id": q, "text": f"t{q}"}),
                         headers=[("id", q.encode())], timestamp=now - 50)  # fmt: skip
    for click, q in clicks.items():
        producer.produce(clicks_topic, value=json.dumps({"click_id": click, "query_id": q}),
                         headers=[("id", click.encode())], timestamp=now)  # fmt: skip
    assert producer.flush(10) == 0
    pipeline = PipelineProcess.run_target(
        "tests.e2e.join_target:topology",
        {**env, "MILLSTREAM_TEST_CRASH_AT": "after_registry_insert"},
        tmp_path / "pipeline.log",
        cwd=ROOT,
    )
    try:
        pipeline.start()
        assert pipeline.wait_exit(180) == -9, pipeline.log_tail()
        assert "CRASH after_registry_insert 1" in crashes.read_text()
        reg = IdRegistry(connect(redis_url), registry)
        held = [t for t in reg.holders([(c, now) for c in clicks]) if t is not None]
        assert held and all(t.startswith(f"{app}|joiner|") for t in held)
        before = {c for c, _, _ in _joined(kafka_bootstrap, f"{app}.joined").values()}
        assert len(before) < len(held)  # registered, not all output: the window is open

        # The verifier sees them in flight: registered, their checkpoints still there.
        until = str(now + 1_000)
        found = _join_cli(env, "verify", "--apps", app, "--until-ms", until, "--json")
        assert found.returncode == 1, found.stderr
        report = json.loads(found.stdout)
        assert report["in_flight"] == len(held) - len(before) and report["orphaned"] == 0
        # Output lost after registration: one shard's checkpoints deleted. Its clicks are
        # orphans: registered, never output, nothing left to deliver them.
        lost_shard = int(report["examples"]["in_flight"][0][1].rsplit("|", 2)[1])
        lost_keys = ShardKeys(app, "joiner", lost_shard)
        lost = {
            json.loads(decode_production(raw).value)["click"]
            for raw in redis_client.hvals(lost_keys.productions)
        }
        redis_client.delete(
            lost_keys.productions, lost_keys.production_times, lost_keys.production_system_times
        )
        found = json.loads(_join_cli(env, "verify", "--apps", app, "--until-ms", until,
                                     "--json").stdout)  # fmt: skip
        assert found["orphaned"] == len(lost) > 0, found
        assert all(t.startswith(f"{app}|joiner|{lost_shard}|")
                   for _, t in found["examples"]["orphaned"])  # fmt: skip

        pipeline.start(env)  # delivers the ones in flight: the registry says "ours"
        recovered = _join_cli(env, "recover", "--apps", app, "--into", app, "--until-ms", until,
                              "--yes", "--json")  # fmt: skip
        assert recovered.returncode == 0, recovered.stderr
        done = json.loads(recovered.stdout)
        assert done["released"] == done["requeued"] == len(lost), done
        pipeline.wait_for(
            lambda: len(_joined(kafka_bootstrap, f"{app}.joined")) >= len(clicks),
            120,
            "every click joined",
        )
        time.sleep(1.0)  # a (wrong) second output would land by now
        output = list(_joined(kafka_bootstrap, f"{app}.joined").values())
        assert sorted(c for c, _, _ in output) == sorted(clicks)  # each click once
        for click, body, _ in output:
            assert body == {"click": click, "query": clicks[click], "text": f"t{clicks[click]}"}
        assert metric(redis_client, app, "joiner", "registered_before") > 0  # "ours" again
        assert metric(redis_client, app, "joiner", "lost_races") == 0
        final = _join_cli(env, "verify", "--apps", app, "--until-ms", until, "--json")
        assert final.returncode == 0 and json.loads(final.stdout)["exactly_once"], final.stdout
    finally:
        pipeline.stop(30)
