"""`millstream run` uses embedded Redis/Kafka only when asked; the metrics and watch settings.

Pure decisions, in process: nothing here starts a service (`embedded_services` is replaced by a
guard that fails the test if anything would start).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from millstream.cli import build_parser, main
from millstream.errors import ConfigurationError
from millstream.settings import Settings

BOTH = {"REDIS_URL": "redis://127.0.0.1:6379/0", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("MILLSTREAM_") or name in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """Replaces `embedded_services`: records each call instead of starting anything."""
    import millstream.embedded

    calls: list[Settings] = []

    @contextmanager
    def record(settings: Settings, *args: Any, **kwargs: Any) -> Iterator[tuple[str, str]]:
        calls.append(settings)
        yield ("redis://127.0.0.1:1/0", "127.0.0.1:1")

    monkeypatch.setattr(millstream.embedded, "embedded_services", record)
    return calls


# ---------------------------------------------------------------- the decision


@pytest.mark.parametrize(
    ("env", "named", "not_named"),
    [
        ({}, "REDIS_URL and KAFKA_BOOTSTRAP_SERVERS are not set", None),
        ({"KAFKA_BOOTSTRAP_SERVERS": "b:9092"}, "REDIS_URL is not set", "KAFKA_BOOTSTRAP"),
        ({"REDIS_URL": "redis://r:6379/0"}, "KAFKA_BOOTSTRAP_SERVERS is not set", "REDIS_URL"),
        ({"MILLSTREAM_EMBEDDED": "auto"}, "REDIS_URL and KAFKA_BOOTSTRAP_SERVERS", None),
    ],
)
def test_run_refuses_unset_endpoints_unless_asked(
    env: dict[str, str], named: str, not_named: str | None
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Settings.from_env(env).require_endpoints()
    message = str(raised.value)
    assert named in message
    assert "--embedded" in message and "MILLSTREAM_EMBEDDED=always" in message
    assert "\n" not in message
    if not_named:
        assert not_named not in message


@pytest.mark.parametrize(
    ("env", "embedded"),
    [
        (BOTH, False),
        ({}, True),
        ({"MILLSTREAM_EMBEDDED": "always"}, False),
        ({"MILLSTREAM_EMBEDDED": "ALWAYS", "REDIS_URL": "redis://r:6379/0"}, False),
    ],
)
def test_run_accepts_set_endpoints_or_an_explicit_embedded(
    env: dict[str, str], embedded: bool
) -> None:
    Settings.from_env(env).require_endpoints(embedded=embedded)


@pytest.mark.parametrize("value", ["yes", "true", "", "sometimes"])
def test_a_bad_embedded_value_is_refused_at_start_up(value: str) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"MILLSTREAM_EMBEDDED=.* is invalid: expected auto, always or never",
    ):
        Settings.from_env({"MILLSTREAM_EMBEDDED": value})


def test_endpoints_refuse_before_starting_anything(started: list[Settings]) -> None:
    from millstream.connectors.app import endpoints

    with pytest.raises(ConfigurationError, match="REDIS_URL"), endpoints(Settings.from_env({})):
        pass
    assert started == []
    with endpoints(Settings.from_env({}), embedded=True) as ends:
        assert ends.redis_url == "redis://127.0.0.1:1/0"
    assert len(started) == 1


def test_run_command_without_endpoints_fails_in_one_line(
    started: list[Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "onepipe.py").write_text(PIPELINE)
    assert main(["run", "onepipe:topology"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("millstream: error: REDIS_URL and KAFKA_BOOTSTRAP_SERVERS are not set")
    assert err.count("\n") == 1, err
    assert started == []


def test_run_flag_parses() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "m:t"]).embedded is False
    assert parser.parse_args(["run", "--embedded", "m:t"]).embedded is True


# ---------------------------------------------------------------- metrics and watch settings


def test_metrics_are_off_by_default_and_bind_to_loopback() -> None:
    settings = Settings.from_env({})
    assert settings.metrics_port is None
    assert settings.metrics_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("env", "port", "host"),
    [
        ({"MILLSTREAM_METRICS_PORT": "9464"}, 9464, "127.0.0.1"),
        (
            {"MILLSTREAM_METRICS_PORT": " 65535 ", "MILLSTREAM_METRICS_HOST": "0.0.0.0"},
            65535,
            "0.0.0.0",
        ),
        ({"MILLSTREAM_METRICS_PORT": "1", "MILLSTREAM_METRICS_HOST": "::"}, 1, "::"),
        ({"MILLSTREAM_METRICS_HOST": "metrics.internal"}, None, "metrics.internal"),
    ],
)
def test_metrics_settings_are_read(env: dict[str, str], port: int | None, host: str) -> None:
    settings = Settings.from_env(env)
    assert (settings.metrics_port, settings.metrics_host) == (port, host)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MILLSTREAM_METRICS_PORT": "0"}, "MILLSTREAM_METRICS_PORT='0' is invalid"),
        ({"MILLSTREAM_METRICS_PORT": "65536"}, "MILLSTREAM_METRICS_PORT='65536' is invalid"),
        ({"MILLSTREAM_METRICS_PORT": "http"}, "MILLSTREAM_METRICS_PORT='http' is invalid"),
        ({"MILLSTREAM_METRICS_HOST": "not a host"}, "MILLSTREAM_METRICS_HOST='not a host'"),
        ({"MILLSTREAM_METRICS_HOST": ""}, "MILLSTREAM_METRICS_HOST='' is invalid"),
    ],
)
def test_bad_metrics_settings_are_refused(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match="is invalid: expected") as raised:
        Settings.from_env(env)
    assert named in str(raised.value)


def test_status_watch_parses() -> None:
    parser = build_parser()
    assert parser.parse_args(["status"]).watch is None
    assert parser.parse_args(["status", "--watch"]).watch == 2.0
    assert parser.parse_args(["status", "--watch", "0.5", "--json"]).watch == 0.5


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "soon"])
def test_status_watch_rejects_bad_seconds(seconds: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["status", "--watch", seconds])
    assert exited.value.code == 2
    assert "--watch" in capsys.readouterr().err


PIPELINE = """
from millstream import Computation, Topology, kafka_source


class Count(Computation):
    def process_record(self, ctx, record):
        ctx.set_state(ctx.get_state(0) + 1)


topology = Topology("onepipe")
topology.source("input", kafka_source("onepipe-input"))
topology.computation("count", Count(), inputs=["input"])
"""


@pytest.mark.parametrize(
    ("folder", "local"),
    [
        (".millstream/checkpoints", True),
        ("/var/lib/app/checkpoints", True),
        ("file:///var/lib/app/checkpoints", True),
        ("hdfs://namenode/app/checkpoints", False),
        ("s3a://bucket/app/checkpoints", False),
    ],
)
def test_local_checkpoints_are_renamed_without_a_child_process(folder: str, local: bool) -> None:
    """On the local disk Spark's checkpoint files go through the FileSystem API (one rename(2));
    a distributed file system keeps Spark's default manager, atomic there."""
    from millstream.connectors.spark_session import LOCAL_CHECKPOINTS, checkpoint_config

    config = checkpoint_config(folder)
    if local:
        assert config == {"spark.sql.streaming.checkpointFileManagerClass": LOCAL_CHECKPOINTS}
    else:
        assert config == {}


def test_driver_jvm_options_put_the_settings_between_logging_and_the_archive() -> None:
    """The pipeline's driver JVM gets MILLSTREAM_DRIVER_JAVA_OPTIONS (C1 and the serial
    collector by default) beside the logging and class-archive options; empty leaves them."""
    from millstream.connectors.spark_session import driver_java_options

    log_options = "-Dlog4j2.configurationFile=/x.xml"
    archive = ["-XX:SharedArchiveFile=/a.jsa", "-Xlog:cds=off"]
    assert driver_java_options(Settings.from_env({}), log_options, archive) == (
        "-Dlog4j2.configurationFile=/x.xml -XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
        "-XX:SharedArchiveFile=/a.jsa -Xlog:cds=off"
    )
    empty = Settings.from_env({"MILLSTREAM_DRIVER_JAVA_OPTIONS": ""})
    assert driver_java_options(empty, "", []) == ""
    assert driver_java_options(empty, log_options, archive) == " ".join([log_options, *archive])
