"""What a computation reads when it starts: its recorded shard count, and the partition counts of
its internal input topics. Real Redis and the real broker; no query starts, so no Spark."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.connectors.app import Application
from millstream.connectors.fused import FusedRunner
from millstream.connectors.targets import Endpoints
from millstream.errors import ConfigurationError
from millstream.settings import Settings
from millstream.state.client import connect
from millstream.state.keys import app_key
from millstream.state.shard_count import record_shard_count, shard_counts_key
from millstream.state.watermarks import Watermark, WatermarkAuthority


class Noop(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


def test_a_changed_shard_count_starts_no_computation(
    redis_url: str, kafka_bootstrap: str, redis_namespace: str
) -> None:
    """`b` first ran with 4 shards and is now configured with 8: start() names both counts and
    starts nothing, not even `a`, which comes first and is fine."""
    app = redis_namespace
    topology = Topology(app).source("events", kafka_source(f"{app}.events"))
    topology.computation("a", Noop(), inputs={"events": json_field("k")})
    topology.computation("b", Noop(), inputs={"events": json_field("k")})
    settings = Settings(redis_url=redis_url, kafka_bootstrap_servers=kafka_bootstrap, app=app)
    assert settings.shards == 8
    client = connect(redis_url)
    record_shard_count(client, app, "b", 4)  # b's first start
    ends = Endpoints(redis_url=redis_url, kafka={"bootstrap.servers": kafka_bootstrap})
    application = Application(topology, settings, ends, spark=None)  # a query would need Spark
    with pytest.raises(ConfigurationError, match=r"'b' .* with 4 shards .* with 8") as raised:
        application.start()
    assert "\n" not in str(raised.value)
    assert application.runners == {}
    assert client.hgetall(shard_counts_key(app)) == {b"a": b"8", b"b": b"4"}


def test_in_flight_records_in_partition_6_of_8_hold_the_consumer(
    redis_url: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
    redis_namespace: str,
) -> None:
    """The user created the internal topic with 8 partitions, not the default 4: a record
    delivered to partition 6 and not yet read holds the consumer's input watermark."""
    app = redis_namespace
    topology = Topology(app).source("events", kafka_source(f"{app}.events"))
    topology.computation("up", Noop(), inputs={"events": json_field("k")}, outputs=["mid"])
    topology.computation("down", Noop(), inputs={"mid": json_field("k")})
    kafka_topic_factory(partitions=2, name=f"{app}.events")  # inputs must exist
    kafka_topic_factory(partitions=8, name=topology.topic_of("mid"))
    settings = Settings(redis_url=redis_url, kafka_bootstrap_servers=kafka_bootstrap, app=app)
    ends = Endpoints(redis_url=redis_url, kafka={"bootstrap.servers": kafka_bootstrap})
    Application(topology, settings, ends, spark=None).prepare()  # leaves the topic as it is
    # `down` added later runs in a query of its own, reading `mid` from its topic.
    runner = FusedRunner(topology, settings, ends, ["down"], segment="down")
    runner.read_partitions()
    assert runner.watermarks.partitions == {"mid": 8}
    stage = runner.stages["down"]

    authority = WatermarkAuthority(connect(redis_url), app)
    authority.publish("up", Watermark(10_000, 10_000))
    authority.add_in_flight("mid", [(6, 41, Watermark(500, 510))], token="batch-1")
    assert runner.watermarks.input(stage, {}, {}) == Watermark(500, 510)
    # Once the consumer has read past offset 41 of partition 6, only the producer holds it.
    connect(redis_url).hset(app_key(app, "consumed", "down", "mid"), mapping={6: 42})
    assert runner.watermarks.input(stage, {}, {}) == Watermark(10_000, 10_000)
