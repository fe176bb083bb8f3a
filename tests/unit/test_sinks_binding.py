"""Kafka sinks declared without Kafka settings take their application's (`Sink.bind`).

The rule: settings given to the constructor win; a sink given none is bound, on the driver when
the application starts, to the application's Kafka settings, as a copy (the declared sink stays
unbound); used with no settings and no application, it says what to do. Nothing here connects
to a broker.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from millstream import Computation, Context, Record, Topology, kafka_source
from millstream.connectors.stage_plan import PlanContext, targets_of
from millstream.connectors.targets import Endpoints, UserSink
from millstream.errors import ConfigurationError
from millstream.records import Production
from millstream.settings import Settings
from millstream.sinks.base import ShardRef, Sink, bind_sink
from millstream.sinks.file_sink import FileSink
from millstream.sinks.kafka_idempotent import KafkaIdempotentSink
from millstream.sinks.kafka_stream import KafkaStreamSink
from millstream.sinks.kafka_transactional import KafkaTransactionalSink

APP_KAFKA = {"bootstrap.servers": "app-broker:9092", "security.protocol": "SASL_SSL"}
OWN_KAFKA = {"bootstrap.servers": "own-broker:9092"}
KAFKA_SINKS = [KafkaTransactionalSink, KafkaIdempotentSink, KafkaStreamSink]


@pytest.mark.parametrize("kind", KAFKA_SINKS)
def test_a_sink_without_settings_is_bound_to_the_applications(kind: Any) -> None:
    declared = kind(topic="out")
    bound = declared.bind(APP_KAFKA)
    assert bound is not declared and isinstance(bound, kind)
    assert bound._kafka.connection == APP_KAFKA
    assert bound._kafka.producer["bootstrap.servers"] == "app-broker:9092"
    assert bound._kafka.producer["security.protocol"] == "SASL_SSL"
    assert bound._kafka.producer["enable.idempotence"] is True  # still the sink's own guarantee
    assert bound._topic_for == "out"
    # The declared sink stays unbound: another application binds it to its own cluster.
    assert not declared._kafka.bound
    other = declared.bind(OWN_KAFKA)
    assert other._kafka.connection == OWN_KAFKA and bound._kafka.connection == APP_KAFKA
    shipped = pickle.loads(pickle.dumps(bound))  # as the driver ships it to executors
    assert shipped._kafka.producer == bound._kafka.producer


@pytest.mark.parametrize("kind", KAFKA_SINKS)
def test_settings_given_to_the_constructor_win(kind: Any) -> None:
    positional = kind(OWN_KAFKA, "out")  # the form existing code uses
    assert positional.bind(APP_KAFKA) is positional
    assert positional._kafka.connection == OWN_KAFKA
    keyword = kind(OWN_KAFKA, topic="out")
    assert keyword.bind(APP_KAFKA) is keyword and keyword._topic_for == "out"
    mapping = kind(OWN_KAFKA, topic_for={"a": "ta"})
    assert mapping.bind(APP_KAFKA)._kafka.connection == OWN_KAFKA


@pytest.mark.parametrize("kind", KAFKA_SINKS)
def test_without_settings_or_application_the_error_says_what_to_do(kind: Any) -> None:
    sink = kind(topic="out")
    production = Production("s", "k", b"v", 1, b"id", 1, seq=1)
    for use in (sink.setup, lambda: sink.deliver(ShardRef("a", "c", 0), [production])):
        with pytest.raises(ConfigurationError) as caught:
            use()
        message = str(caught.value)
        assert f"{kind.__name__} has no Kafka settings" in message, message
        assert "Topology" in message and "kafka_config()" in message, message
    sink.close()  # nothing was ever started: closing is quiet


@pytest.mark.parametrize("kind", KAFKA_SINKS)
def test_constructor_mistakes_fail_at_once(kind: Any) -> None:
    with pytest.raises(ConfigurationError, match="exactly one of topic="):
        kind()
    with pytest.raises(ConfigurationError, match="exactly one of topic="):
        kind(OWN_KAFKA, "a", topic="b")
    with pytest.raises(ConfigurationError, match=r"kafka_config must be a mapping.*topic=\.\.\."):
        kind("out")  # the topic given where the settings go
    # A producer setting that would weaken the guarantee is refused before any binding...
    with pytest.raises(ConfigurationError, match="acks"):
        kind(topic="out", producer_config={"acks": "1"})
    # ...and so is one in the application's settings, when binding.
    with pytest.raises(ConfigurationError, match=r"enable\.idempotence"):
        kind(topic="out").bind({**APP_KAFKA, "enable.idempotence": "false"})


def test_bind_sink_leaves_sinks_that_need_no_kafka_alone(tmp_path: Any) -> None:
    files = FileSink(str(tmp_path))
    assert bind_sink(files, APP_KAFKA) is files  # Sink.bind's default
    assert isinstance(files, Sink)
    plain = SimpleNamespace(deliver=lambda shard, productions: None)  # duck-typed, no bind
    assert bind_sink(plain, APP_KAFKA) is plain


class Echo(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", ctx.key, record.value)


def test_the_runtime_binds_user_sinks_to_the_endpoints_kafka() -> None:
    """The plan's wiring: the target the driver delivers to carries the bound sink."""
    declared = KafkaTransactionalSink(topic="out-topic")
    topology = Topology("app")
    topology.source("in", kafka_source("in"))
    topology.computation("echo", Echo(), inputs=["in"], outputs=["out"])
    topology.sink("out", declared)
    ends = Endpoints("redis://127.0.0.1:9/0", dict(APP_KAFKA))
    targets = targets_of(PlanContext(topology, Settings(), ends), "out", False, False)
    (factory,) = [t.factory for t in targets]
    assert isinstance(factory, UserSink)
    sink = pickle.loads(pickle.dumps(factory))()
    assert isinstance(sink, KafkaTransactionalSink)
    assert sink._kafka.connection == APP_KAFKA
    assert not declared._kafka.bound  # the topology's own object is left as declared
