"""Bad infrastructure on real Spark, Redis and Kafka (issue #9).

- An unreachable broker at start-up: `millstream run` fails within a bounded time with a clear
  error, before it starts Spark.
- Two faults in turn on one running pipeline (`forward` -> `tally`, a Redis of its own with
  `noeviction`, a durable broker), each checked as it happens, every record checked against
  the ground truth the sender keeps after each:
  1. Redis at `maxmemory`: every write is refused. The pipeline does not die: the driver logs
     a clear error naming Redis maxmemory and the fix, commits nothing and re-runs the batch
     until Redis accepts writes again; then every record is counted exactly once.
  2. The broker stopped for ~10 s and restarted with its data: the queries keep running and
     every record (sent before, during and after the outage) is counted exactly once.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from confluent_kafka import Producer

from millstream import Computation, Context, Record, Topology, kafka_source
from millstream.connectors.app import Application
from millstream.connectors.targets import Endpoints
from millstream.embedded import KafkaService, start_redis
from millstream.settings import Settings
from millstream.state.keys import ShardKeys
from millstream.testing.infra import create_topic
from tests.e2e.conftest import shard_states, wait_until
from tests.integration.test_cli_errors import millstream

pytestmark = pytest.mark.spark

SHARDS = 2


class Tally(Computation):
    """Sums `amount` per key."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + json.loads(record.value)["amount"])


class Forward(Computation):
    """Re-keys each record by its `k` field onto the internal stream `fwd`."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("fwd", json.loads(record.value)["k"], record.value, record.timestamp)


def committed(client: Any, app: str, computation: str, name: str) -> int:
    """A counter committed atomically with the shards' effects (exact across batch re-runs)."""
    return sum(
        int(client.hget(ShardKeys(app, computation, s).counters, name) or 0) for s in range(SHARDS)
    )


@pytest.fixture
def launch(spark: Any, tmp_path: Path) -> Iterator[Callable[..., Application]]:
    """`launch(topology, redis_url, bootstrap)`: like `start_app`, on services of the test's own."""
    from millstream.injectors import register

    register(spark)
    apps: list[Application] = []

    def start(topology: Topology, redis_url: str, bootstrap: str) -> Application:
        settings = Settings(
            redis_url=redis_url,
            kafka_bootstrap_servers=bootstrap,
            app=topology.app,
            checkpoint_dir=str(tmp_path / "checkpoints"),
            shards=SHARDS,
            trigger_ms=200,
        )
        ends = Endpoints(redis_url=redis_url, kafka={"bootstrap.servers": bootstrap})
        app = Application(topology, settings, ends, spark)
        app.prepare()
        app.start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.stop()


class Sender:
    """Produces `{"k", "amount"}` records and keeps the ground truth."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        # A long delivery timeout: records sent while the broker is down wait for it.
        self.producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 120_000})
        self.topic = topic
        self.truth: Counter[str] = Counter()
        self.sent = 0
        self.failures: list[Any] = []

    def send(self, count: int) -> None:
        for _ in range(count):
            key = f"k{self.sent % 5}"
            amount = 1 + self.sent % 13
            self.producer.produce(
                self.topic,
                key=key,
                value=json.dumps({"k": key, "amount": amount}),
                on_delivery=self._delivered,
            )
            self.truth[key] += amount
            self.sent += 1
        self.producer.poll(0)

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failures.append(err)

    def flush(self) -> None:
        assert self.producer.flush(150) == 0
        assert not self.failures, self.failures


def test_unreachable_broker_at_start_fails_fast_with_a_clear_error(
    redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "mypipeline.py").write_text(
        "from millstream import Computation, Topology, kafka_source\n"
        "class Noop(Computation):\n"
        "    def process_record(self, ctx, record):\n"
        "        pass\n"
        "topology = Topology('unreachable')\n"
        "topology.source('in', kafka_source('input'))\n"
        "topology.computation('noop', Noop(), inputs=['in'])\n"
    )
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "REDIS_URL": redis_url,
        "MILLSTREAM_EMBEDDED": "never",
        "MILLSTREAM_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }
    started = time.monotonic()
    result = millstream(["run", "mypipeline:topology"], env, tmp_path)
    elapsed = time.monotonic() - started
    err = result.stderr
    assert result.returncode != 0, (result.returncode, err)
    assert elapsed < 40, f"took {elapsed:.0f} s"  # ALL_DOWN_FAIL_S after the first refusal
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("millstream: error: Kafka at 127.0.0.1:1 is unreachable"), last
    assert "check KAFKA_BOOTSTRAP_SERVERS and that the broker runs" in last, last
    assert "log4j" not in err and "Spark" not in err, "Spark was started before the check"
    assert result.stdout == ""


def test_redis_at_maxmemory_then_the_broker_down_mid_run_every_record_counted_once(
    launch: Any,
    durable_kafka: KafkaService,
    redis_namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="millstream.connectors.fused")
    bootstrap = durable_kafka.bootstrap
    service = start_redis(tmp_path / "oom-redis", extra_args=["--maxmemory-policy", "noeviction"])
    client = redis_py.Redis.from_url(service.url)
    app: Application | None = None
    try:
        app_name = redis_namespace
        topic = create_topic(bootstrap, partitions=2)
        topology = Topology(app_name)
        topology.source("orders", kafka_source(topic), max_out_of_order_ms=60_000)
        topology.computation("forward", Forward(), inputs=["orders"], outputs=["fwd"])
        topology.computation("tally", Tally(), inputs=["fwd"], shards=SHARDS)
        app = launch(topology, service.url, bootstrap)
        sender = Sender(bootstrap, topic)

        def all_counted() -> bool:
            return shard_states(client, app_name, "tally", SHARDS) == dict(sender.truth)

        def assert_counted_once() -> None:
            assert shard_states(client, app_name, "tally", SHARDS) == dict(sender.truth)
            for computation in ("forward", "tally"):
                assert committed(client, app_name, computation, "records") == sender.sent
                assert committed(client, app_name, computation, "dead_letters") == 0

        sender.send(30)
        sender.flush()
        wait_until(all_counted, 120, "the first records through both stages", app)

        # 1. Fill Redis up to a 2 MB maxmemory: from now on every write is refused (OOM).
        client.config_set("maxmemory", "2mb")
        with pytest.raises(redis_py.OutOfMemoryError):
            for filler in range(1000):
                client.set(f"filler:{filler}", b"x" * 65_536)
        # Pin the limit a little below what is used: memory freed by client buffers (up to the
        # refused 64 KiB SET) must not let a commit slip through while the test expects none.
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used - 256 * 1024))
        with pytest.raises(redis_py.OutOfMemoryError):
            client.set("filler:small", b"x")
        before = dict(sender.truth)
        forwarded = committed(client, app_name, "forward", "records")
        sender.send(20)
        sender.flush()

        def reported() -> bool:
            return any("is at maxmemory" in r.getMessage() for r in caplog.records)

        wait_until(reported, 90, "the driver to report Redis at maxmemory", app)
        time.sleep(3)  # a few more refused batches
        app.check()  # still running: refused writes are retried, not fatal
        assert all(q.query.isActive for q in app.runners.values())
        message = next(
            r.getMessage() for r in caplog.records if "is at maxmemory" in r.getMessage()
        )
        assert f"Redis at {service.url} is at maxmemory and refuses writes" in message, message
        assert f"application {app_name!r} cannot commit batch" in message, message
        assert "CONFIG SET maxmemory" in message and "noeviction" in message, message
        assert "Retrying in" in message, message
        # Nothing committed at either stage.
        assert shard_states(client, app_name, "tally", SHARDS) == before
        assert committed(client, app_name, "forward", "records") == forwarded

        client.config_set("maxmemory", "0")  # the operator's fix
        wait_until(all_counted, 90, "every record counted after maxmemory was raised", app)
        app.check()
        # A double count from the re-run batches would show here or, landing later, at the end.
        assert_counted_once()

        # 2. The broker stopped for ~10 s and restarted with its data, on the same pipeline.
        durable_kafka.kill9()
        sender.send(15)  # buffered by the producer while the broker is down
        for _ in range(10):
            time.sleep(1)
            app.check()  # the queries ride the outage out
        durable_kafka.restart()
        sender.send(15)
        sender.flush()

        wait_until(all_counted, 180, "every record counted after the broker came back", app)
        time.sleep(3)  # a double count would show up in the next batches
        app.check()
        assert_counted_once()
    finally:
        if app is not None:
            app.stop()  # before its Redis goes away
        client.close()
        service.stop()
