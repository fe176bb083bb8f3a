"""Who delivers a computation's strong productions: `delivery="auto"` picks the driver only
when a target keeps a producer per shard (a Kafka transactional sink)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from millstream import Computation, Context, Record, Topology, kafka_source
from millstream.connectors.driver import ComputationRunner, Endpoints
from millstream.errors import ConfigurationError
from millstream.sinks.kafka_stream import KafkaStreamSink
from millstream.sinks.kafka_transactional import KafkaTransactionalSink

KAFKA = {"bootstrap.servers": "127.0.0.1:9"}


class Echo(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", ctx.key, record.value)


def _from_driver(sink: object | None, delivery: str = "auto") -> bool:
    topology = Topology("app")
    topology.source("in", kafka_source("in"))
    topology.computation("echo", Echo(), inputs=["in"], outputs=["out"], delivery=delivery)
    if sink is not None:
        topology.sink("out", sink)
    runner = SimpleNamespace(
        endpoints=Endpoints("redis://127.0.0.1:9/0", KAFKA),
        spec=topology.computations["echo"],
        topology=topology,
    )
    runner.deliveries = ComputationRunner._deliveries(runner)  # type: ignore[arg-type]
    return ComputationRunner._delivers_from_driver(runner)  # type: ignore[arg-type]


def test_auto_delivers_from_the_driver_only_for_per_shard_producers() -> None:
    assert _from_driver(KafkaTransactionalSink(KAFKA, "t")) is True
    assert _from_driver(KafkaStreamSink(KAFKA, "t")) is False
    assert _from_driver(None) is False  # an internal stream: the idempotent producer


def test_an_explicit_choice_wins() -> None:
    assert _from_driver(KafkaTransactionalSink(KAFKA, "t"), "task") is False
    assert _from_driver(None, "driver") is True


def test_an_unknown_choice_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="delivery must be 'auto', 'driver' or 'task'"):
        _from_driver(None, "executor")
