"""MILLSTREAM_KAFKA_* reaches every Kafka client millstream builds, secrets masked when printed.

One environment with SASL over TLS; each builder's configuration must carry all four security
settings. The builders are the real wiring code; only Spark's DataStreamReader is stood in for
by a recorder of `.option()` calls (no client here connects anywhere).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from millstream.connectors.app import endpoints
from millstream.connectors.query_sources import kafka_options
from millstream.connectors.stage_plan import PlanContext, targets_of
from millstream.connectors.targets import Endpoints, InternalStreamSink
from millstream.connectors.topics import ensure_topics
from millstream.demo.worker import topology_from
from millstream.errors import ConfigurationError
from millstream.injectors._kafka_options import KafkaInjectorOptions, options_from_settings
from millstream.kafka_admin import redact
from millstream.settings import Settings
from millstream.sinks.kafka_stream import KafkaStreamSink
from millstream.sinks.kafka_transactional import KafkaTransactionalSink
from tests.secrets import KAFKA_SASL_PASSWORD, MARKER

BOOTSTRAP = "broker-1.example.com:9093"
SECURITY = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "millstream-svc",
    "sasl.password": KAFKA_SASL_PASSWORD,
}
ENV = {
    "KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP,
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "MILLSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "MILLSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "MILLSTREAM_KAFKA_SASL_USERNAME": "millstream-svc",
    "MILLSTREAM_KAFKA_SASL_PASSWORD": KAFKA_SASL_PASSWORD,
}


DEMO_CONFIG: dict[str, Any] = {
    "app": "passthrough",
    "bootstrap": BOOTSTRAP,
    "input_topic": "q",
    "window_topic": "w",
    "anomaly_topic": "a",
    "log_dir": "/nonexistent",
    "shards": 2,
    "max_out_of_order_ms": 1000,
}


def assert_secured(config: dict[str, Any], where: str) -> None:
    got = {k: config.get(k) for k in SECURITY}
    assert got == SECURITY, f"{where}: {got}"


class RecordingReader:
    """Stands in for Spark's DataStreamReader: records `.option(key, value)` calls."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    def option(self, key: str, value: str) -> RecordingReader:
        self.options[key] = value
        return self


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env(ENV)


@pytest.fixture
def ends(settings: Settings, tmp_path: Path) -> Endpoints:
    """The driver's endpoints, as `millstream run` builds them (nothing embedded is started)."""
    local = Settings.from_env({**ENV, "MILLSTREAM_STATE_DIR": str(tmp_path)})
    with endpoints(local) as built:
        return built


def test_settings_map_the_variables_and_mask_the_password(settings: Settings) -> None:
    assert_secured(settings.kafka_config(), "Settings.kafka_config()")
    assert settings.kafka_config()["bootstrap.servers"] == BOOTSTRAP
    described = settings.describe()["kafka_extra"]
    assert described["sasl.password"] == "***" and described["sasl.username"] == "millstream-svc"
    assert MARKER not in repr(settings)


def test_driver_endpoints_carry_the_extras(ends: Endpoints) -> None:
    assert_secured(ends.kafka, "Endpoints.kafka (ensure_topics, internal streams)")
    assert ends.kafka["bootstrap.servers"] == BOOTSTRAP


def test_injector_options_reach_the_executor_consumers(ends: Endpoints) -> None:
    """Driver -> `millstream-kafka` options -> parsed on the executor -> librdkafka config."""
    reader = RecordingReader()
    reader.options.update(kafka_options(Settings.from_env(ENV), ends))
    assert reader.options["bootstrap.servers"] == BOOTSTRAP
    assert {k: reader.options.get(f"kafka.{k}") for k in SECURITY} == SECURITY

    # Spark hands the options to the data source lower-cased; the source ships them pickled.
    connection = {k: v for k, v in reader.options.items() if k.startswith(("kafka.", "bootstrap"))}
    spark_side = {k.lower(): v for k, v in {**connection, "topics": "in"}.items()}
    options = pickle.loads(pickle.dumps(KafkaInjectorOptions.parse(spark_side)))
    assert_secured(options.client_config(), "injector consumer (read and probe)")
    assert options.describe()["kafka.sasl.password"] == "***"


def test_options_from_settings_carry_the_extras(settings: Settings) -> None:
    options = KafkaInjectorOptions.parse(options_from_settings(settings, "in"))
    assert_secured(options.client_config(), "options_from_settings")


def test_internal_stream_and_dead_letter_producers_carry_the_extras(ends: Endpoints) -> None:
    """The sink factory is pickled to where delivery runs and builds the producer there
    (window counts as read by a computation of another query, so written to their topic)."""
    topology = topology_from(DEMO_CONFIG)
    spec = topology.computations["window_counter"]
    plan = PlanContext(topology, Settings(), ends)
    deliveries = {s: targets_of(plan, s, False, True) for s in spec.outputs}
    factories = [t.factory for targets in deliveries.values() for t in targets]
    internal = [f for f in factories if isinstance(f, InternalStreamSink)]
    assert {f.topic for f in internal} == {
        topology.topic_of("window_counts"),
        topology.topic_of("dead-letters"),
    }, deliveries
    for factory in internal:
        sink = pickle.loads(pickle.dumps(factory))()
        assert isinstance(sink, KafkaStreamSink)
        assert_secured(sink._kafka.producer, f"producer of {factory.topic}")
        assert_secured(sink._kafka.connection, f"metadata client of {factory.topic}")


def test_demo_pipeline_sinks_carry_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo worker builds its own transactional sinks from its config and the environment."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    topology = topology_from(DEMO_CONFIG)
    assert topology.sinks
    for stream, sink in topology.sinks.items():
        assert isinstance(sink, KafkaTransactionalSink)
        assert_secured(sink._kafka.producer, f"demo sink {stream} producer")
        assert_secured(sink._kafka.connection, f"demo sink {stream} admin and progress consumer")


def test_user_sink_from_kafka_config_carries_the_extras(settings: Settings) -> None:
    sink = KafkaTransactionalSink(settings.kafka_config(), "out")
    assert_secured(sink._kafka.producer, "KafkaTransactionalSink producer")
    stream = KafkaStreamSink(settings.kafka_config(), "out")
    assert_secured(stream._kafka.producer, "KafkaStreamSink producer")


def test_user_sink_without_settings_is_bound_with_the_extras(ends: Endpoints) -> None:
    """`KafkaTransactionalSink(topic=...)` gets the driver's endpoints, security included."""
    bound = KafkaTransactionalSink(topic="out").bind(ends.kafka)
    assert_secured(bound._kafka.producer, "bound KafkaTransactionalSink producer")
    assert_secured(bound._kafka.connection, "bound KafkaTransactionalSink admin and consumer")


def test_an_invalid_setting_is_a_configuration_error_without_the_password() -> None:
    """librdkafka refuses the value when the client is built: no connection is attempted."""
    config = {**SECURITY, "bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_TLS"}
    with pytest.raises(ConfigurationError) as caught:
        ensure_topics(config, {"t": 1}, timeout=5)
    message = str(caught.value)
    assert "security.protocol" in message and "MILLSTREAM_KAFKA_" in message, message
    assert MARKER not in message


def test_redact_hides_secret_settings_in_error_text() -> None:
    text = f"handshake failed for millstream-svc with {KAFKA_SASL_PASSWORD}"
    out = redact(text, SECURITY)
    assert MARKER not in out and "millstream-svc" in out
