"""Settings.from_env: validation with actionable messages, and secrets never printed."""

from __future__ import annotations

import pytest

from millstream.errors import ConfigurationError
from millstream.settings import Settings, mask_url


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings.redis_url is None
    assert settings.kafka_bootstrap_servers is None
    assert settings.app == "millstream"
    assert settings.shards == 8
    assert settings.embedded == "auto"


def test_reads_standard_names() -> None:
    settings = Settings.from_env(
        {
            "REDIS_URL": "redis://localhost:6379/2",
            "KAFKA_BOOTSTRAP_SERVERS": "broker-1:9092,broker-2:9093",
            "MILLSTREAM_APP": "orders",
            "MILLSTREAM_SHARDS": "16",
        }
    )
    assert settings.redis_url == "redis://localhost:6379/2"
    assert settings.kafka_config()["bootstrap.servers"] == "broker-1:9092,broker-2:9093"
    assert (settings.app, settings.shards) == ("orders", 16)


@pytest.mark.parametrize(
    "url",
    [
        "localhost:6379",  # no scheme
        "http://localhost:6379/0",  # wrong scheme
        "redis://localhost:notaport/0",
        "redis://localhost:6379/zero",  # database is not a number
        "redis://:6379/0",  # no host
    ],
)
def test_bad_redis_url_is_rejected(url: str) -> None:
    with pytest.raises(ConfigurationError, match="REDIS_URL"):
        Settings.from_env({"REDIS_URL": url})


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h:6380", "unix:///tmp/redis.sock"])
def test_good_redis_urls_are_accepted(url: str) -> None:
    assert Settings.from_env({"REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize(
    "servers",
    [
        "localhost",
        "localhost:",
        "localhost:99999",
        "host:9092,",
        "host:9092;other:9092",
        "http://h:9092",
    ],
)
def test_bad_bootstrap_servers_are_rejected(servers: str) -> None:
    with pytest.raises(ConfigurationError, match="KAFKA_BOOTSTRAP_SERVERS") as info:
        Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": servers})
    assert "host:port" in str(info.value)  # the message says what a good value looks like


def test_unknown_millstream_variable_is_named() -> None:
    with pytest.raises(ConfigurationError, match="MILLSTREAM_SHARD_COUNT"):
        Settings.from_env({"MILLSTREAM_SHARD_COUNT": "4"})


def test_pass_through_prefixes_are_not_unknown() -> None:
    settings = Settings.from_env(
        {"MILLSTREAM_KAFKA_SASL_USERNAME": "u", "MILLSTREAM_TEST_REDIS_IMAGE": "redis:7"}
    )
    assert settings.kafka_extra == {"sasl.username": "u"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MILLSTREAM_SHARDS", "0"),
        ("MILLSTREAM_SHARDS", "many"),
        ("MILLSTREAM_ON_USER_ERROR", "ignore"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Settings.from_env({name: value})


def test_redis_password_is_masked_in_describe_and_repr() -> None:
    settings = Settings.from_env({"REDIS_URL": "redis://app:s3cr3t-pw@redis.internal:6379/0"})
    assert settings.redis_url == "redis://app:s3cr3t-pw@redis.internal:6379/0"  # usable as given
    assert settings.describe()["redis_url"] == "redis://app:***@redis.internal:6379/0"
    assert "s3cr3t-pw" not in repr(settings)
    assert "s3cr3t-pw" not in str(settings)
    assert "s3cr3t-pw" not in settings.summary()  # the start-up log line
    assert " redis_url=redis://app:***@redis.internal:6379/0 " in settings.summary()


def test_kafka_secrets_are_masked_in_describe_and_repr() -> None:
    settings = Settings.from_env(
        {"MILLSTREAM_KAFKA_SASL_USERNAME": "svc", "MILLSTREAM_KAFKA_SASL_PASSWORD": "hunter2"}
    )
    assert settings.kafka_extra["sasl.password"] == "hunter2"  # passed to clients unmasked
    described = settings.describe()["kafka_extra"]
    assert described == {"sasl.username": "svc", "sasl.password": "***"}
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in settings.summary()


def test_bad_url_message_does_not_leak_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"REDIS_URL": "redis://app:s3cr3t-pw@host:port/0"})
    assert "s3cr3t-pw" not in str(info.value)


def test_mask_url_leaves_urls_without_password_alone() -> None:
    assert mask_url("redis://localhost:6379/0") == "redis://localhost:6379/0"
    assert mask_url(None) is None


def test_driver_java_options_default_to_c1_and_the_serial_collector() -> None:
    assert Settings.from_env({}).driver_java_options == (
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
    )
    assert Settings.from_env({"MILLSTREAM_DRIVER_JAVA_OPTIONS": ""}).driver_java_options == ()
    given = Settings.from_env({"MILLSTREAM_DRIVER_JAVA_OPTIONS": " -XX:+UseG1GC  -Dx=1 "})
    assert given.driver_java_options == ("-XX:+UseG1GC", "-Dx=1")
    for bad in ("UseSerialGC", "-XX:+UseSerialGC foo", "-Xmx2g", "-Xms1g"):
        with pytest.raises(ConfigurationError, match=r"MILLSTREAM_DRIVER_JAVA_OPTIONS.*-Xmx"):
            Settings.from_env({"MILLSTREAM_DRIVER_JAVA_OPTIONS": bad})


def test_spark_driver_memory_is_a_jvm_size_of_512m_or_more() -> None:
    assert Settings.from_env({}).spark_driver_memory == "1g"
    assert Settings.from_env({"MILLSTREAM_SPARK_DRIVER_MEMORY": "768M"}).spark_driver_memory == (
        "768m"
    )
    assert Settings.from_env({"MILLSTREAM_SPARK_DRIVER_MEMORY": "2g"}).spark_driver_memory == "2g"
    for bad in ("256m", "1.5g", "lots", "1024", "1gb"):
        with pytest.raises(ConfigurationError, match=r"MILLSTREAM_SPARK_DRIVER_MEMORY.*512m"):
            Settings.from_env({"MILLSTREAM_SPARK_DRIVER_MEMORY": bad})
