"""Two join pipelines active-active on one IdRegistry (#28), with the faults a datacenter meets
that the Photon demo does not inject: one pipeline cut off from the registry while the other
runs, then the same pipeline killed and never restarted. At-most-once is sampled every 0.5 s
over both outputs; in the end every click is joined once, with its own query, checked against
what was sent.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.connectors.topics import ensure_topics
from millstream.demo.photon_traffic import OutputWatcher
from millstream.embedded import start_redis
from millstream.state.shard_count import ShardLayout, read_layout
from millstream.state.watermarks import now_ms
from millstream.testing.process import PipelineProcess
from millstream.testing.proxy import TcpProxy, quiet_port
from tests.e2e.conftest import metric
from tests.e2e.sink_faults import ROOT, pipeline_env

pytestmark = pytest.mark.spark

RATE, SECONDS = 40, 22  # clicks per second, seconds of traffic
CUT_AT, CUT_S = 4.0, 7.0  # the first pipeline cannot reach the registry from +4 s to +11 s
DUPLICATES = 0.03  # clicks sent twice under the same record id (a producer's retry)
LATE_EVERY = 10  # every tenth click's query comes 1.5 s after the click


def _join_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "millstream.cli", "join", args[0], "tests.e2e.join_target:topology",
         *args[1:]],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


class _Traffic(threading.Thread):
    """Clicks at RATE for SECONDS, each query 50 ms before its click (every LATE_EVERY-th 1.5 s
    after it), a share of clicks sent twice with the same record id."""

    def __init__(self, bootstrap: str, clicks: str, queries: str) -> None:
        super().__init__(name="join-traffic", daemon=True)
        self.topics = clicks, queries
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.sent: dict[str, str] = {}  # click -> query
        self.end_ms = 0
        self.error: BaseException | None = None

    def _send(self, topic: str, id: str, body: dict[str, str], at: int) -> None:
        self.producer.produce(topic, value=json.dumps(body), headers=[("id", id.encode())],
                              timestamp=at)  # fmt: skip

    def run(self) -> None:
        clicks, queries = self.topics
        late: list[tuple[float, str, int]] = []
        started = time.monotonic()
        try:
            for i in range(RATE * SECONDS):
                due = started + i / RATE
                time.sleep(max(0.0, due - time.monotonic()))
                now = now_ms()
                click, query = f"c{i}", f"q{i}"
                if i % LATE_EVERY == 0:
                    late.append((time.monotonic() + 1.5, query, now))
                else:
                    self._send(queries, query, {"query_id": query, "text": f"t{query}"}, now - 50)
                body = {"click_id": click, "query_id": query}
                self._send(clicks, click, body, now)
                if (i * 7919) % 100 < DUPLICATES * 100:
                    self._send(clicks, click, body, now)
                self.sent[click] = query
                while late and late[0][0] <= time.monotonic():
                    _, q, at = late.pop(0)
                    self._send(queries, q, {"query_id": q, "text": f"t{q}"}, at - 50)
                self.producer.poll(0)
            for _, q, at in late:
                self._send(queries, q, {"query_id": q, "text": f"t{q}"}, at - 50)
            assert self.producer.flush(30) == 0, "traffic not acknowledged"
            self.end_ms = now_ms()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _arm_next_hit(crash_file: Path, n: int) -> None:
    """Make the next `after_registry_insert` hit the n-th (the crash): earlier hits are lines
    of the counter file (millstream/testing/_crash.py), so pad it to n - 1 lines."""
    with open(crash_file, "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        hits = sum(1 for line in counter if not line.startswith("CRASH"))
        assert hits < n - 1, f"{hits} hits already: the crash count was reached early"
        counter.write("".join(f"armed {h} 0\n" for h in range(hits + 1, n)))


def test_one_pipeline_cut_off_from_the_registry_then_killed_for_good(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    """A and B join the same clicks against one registry; A reaches it through a proxy.

    1. Cut off: A cannot register for 7 s. It joins and checkpoints, but outputs nothing
       unregistered; B outputs those clicks. Reconnected, A finds them B's: lost races.
    2. Killed for good: A is SIGKILLed right after registering clicks it has not output (a
       crash point armed once A is reconnected), and never restarted. B carries every other
       click. `join verify` finds A's registered clicks in flight on A. `join recover
       --abandon` is refused for a pipeline that runs (B); for A, gone, it releases them by
       their tokens and B joins them.
    3. Meanwhile B's joiner is rescaled from 2 to 3 shards (`millstream rescale`).
    Every click is output once, by A or by B, with its query; no sample ever saw a click twice.
    """
    apps = [f"{redis_namespace}-a", f"{redis_namespace}-b"]
    registry = f"reg-{redis_namespace}"
    registry_redis = start_redis(tmp_path / "registry")
    proxy = TcpProxy(quiet_port(), registry_redis.port).start()
    clicks_topic, queries_topic = kafka_topic_factory(partitions=2), kafka_topic_factory(2)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    outputs = {app: f"{app}.joined" for app in apps}
    ensure_topics(kafka, dict.fromkeys(outputs.values(), 2))
    crash_file = tmp_path / "crashes"
    common = {"JOIN_TARGET_CLICKS": clicks_topic, "JOIN_TARGET_QUERIES": queries_topic,
              "JOIN_TARGET_REGISTRY": registry}  # fmt: skip
    envs = {
        apps[0]: pipeline_env(
            redis_url,
            kafka_bootstrap,
            apps[0],
            tmp_path / apps[0],
            **common,
            JOIN_TARGET_REGISTRY_URL=f"redis://127.0.0.1:{proxy.listen_port}/0",
            MILLSTREAM_TEST_CRASH_AT="after_registry_insert:1000000",
            MILLSTREAM_TEST_CRASH_FILE=str(crash_file),
        ),
        apps[1]: pipeline_env(
            redis_url,
            kafka_bootstrap,
            apps[1],
            tmp_path / apps[1],
            **common,
            JOIN_TARGET_REGISTRY_URL=registry_redis.url,
        ),
    }
    a, b = (
        PipelineProcess.run_target(
            "tests.e2e.join_target:topology", envs[app], tmp_path / f"{app}.log", cwd=ROOT
        )
        for app in apps
    )
    watcher = OutputWatcher(kafka, outputs)
    traffic = _Traffic(kafka_bootstrap, clicks_topic, queries_topic)
    try:
        a.start()
        b.start()
        for app, pipeline in zip(apps, (a, b), strict=True):
            pipeline.wait_for(lambda app=app: metric(redis_client, app, "joiner", "batches") > 0,
                              180, f"{app} to run a batch")  # fmt: skip
        watcher.start()
        traffic.start()
        began = time.monotonic()
        time.sleep(CUT_AT)

        # 1. A cut off from the registry: joined and checkpointed, nothing output.
        failures = metric(redis_client, apps[0], "joiner", "delivery_failures")
        proxy.cut(CUT_S)
        time.sleep(1.5)  # a delivery registered just before the cut may still go out

        def output_by_a() -> int:
            with watcher._lock:
                return sum(1 for _, app in watcher.seen.first_seen.values() if app == apps[0])

        early = output_by_a()
        time.sleep(CUT_S - 2.5)
        assert output_by_a() == early, "A output clicks it could not register"
        assert metric(redis_client, apps[0], "joiner", "delivery_failures") > failures
        a.wait_for(lambda: time.monotonic() - began > CUT_AT + CUT_S + 1.0, 30, "the cut's end")
        a.wait_for(lambda: metric(redis_client, apps[0], "joiner", "lost_races") > 0, 60,
                   "A to find the clicks B registered meanwhile: lost races")  # fmt: skip

        # 2. A killed for good, right after registering clicks it has not output.
        _arm_next_hit(crash_file, 1_000_000)
        assert a.wait_exit(60) == -9, a.log_tail()
        assert "CRASH after_registry_insert" in crash_file.read_text()
        # 3. B's joiner moves from 2 to 3 shards while it carries every click, some waiting
        #    for their queries (`millstream rescale` waits until B's driver applied it).
        moved = subprocess.run(
            [sys.executable, "-m", "millstream.cli", "rescale", apps[1], "joiner", "--shards",
             "3"], env=envs[apps[1]], cwd=ROOT, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert moved.returncode == 0 and "rescaled joiner" in moved.stdout, moved
        traffic.join(SECONDS + 60)
        assert traffic.error is None and not traffic.is_alive(), traffic.error
        sent = traffic.sent
        until = str(traffic.end_ms + 1_000)

        def verdict() -> dict[str, Any]:
            found = _join_cli(envs[apps[1]], "verify", "--apps", ",".join(apps), "--until-ms",
                              until, "--json")  # fmt: skip
            assert found.returncode in (0, 1), found.stderr
            return json.loads(found.stdout)  # type: ignore[no-any-return]

        report: dict[str, Any] = {}

        def b_carried_the_rest() -> bool:
            nonlocal report
            report = verdict()
            return report["waiting"] == report["missing"] == report["orphaned"] == 0

        b.wait_for(b_carried_the_rest, 120, "B to output every click A does not hold")
        assert report["at_most_once_violations"] == 0, report
        stranded = report["in_flight_by_app"].get(apps[0], 0)
        assert stranded > 0 and report["in_flight"] == stranded, report  # A's only
        assert report["joined"] + stranded == len(sent) == report["clicks"], report

        # Refused while a pipeline runs; given to B once A is gone.
        refused = _join_cli(envs[apps[1]], "recover", "--apps", ",".join(apps), "--into", apps[0],
                            "--abandon", apps[1], "--until-ms", until, "--yes")  # fmt: skip
        assert refused.returncode == 2 and "is running" in refused.stderr, refused.stderr
        recovered = _join_cli(envs[apps[1]], "recover", "--apps", ",".join(apps), "--into",
                              apps[1], "--abandon", apps[0], "--until-ms", until, "--yes",
                              "--json")  # fmt: skip
        assert recovered.returncode == 0, recovered.stderr
        done = json.loads(recovered.stdout)
        assert done["abandoned"] == done["released"] == done["requeued"] == stranded, done
        b.wait_for(lambda: verdict()["exactly_once"], 120, "verify to say exactly once")
        time.sleep(1.0)  # a (wrong) second output would land by now
        watcher.stop()

        seen = watcher.seen
        assert all(s["violations"] == 0 for s in seen.samples), "a click was output twice"
        assert len(seen.samples) > 2 * SECONDS  # sampled all along
        assert set(seen.first_seen) == set(sent)
        for click, query in sent.items():
            assert seen.bodies[click] == {"click": click, "query": query, "text": f"t{query}"}
            assert len(seen.outputs[click]) == 1, click
        assert b.alive, b.log_tail()
        assert read_layout(redis_client, apps[1], "joiner") == ShardLayout(3, 1)
    finally:
        traffic.join(5)
        watcher.stop()
        for pipeline in (a, b):
            pipeline.stop(30)
        proxy.close()
        registry_redis.stop()
