"""docker/docker-compose.yml and docker/Dockerfile describe a runnable Kafka+Redis+demo stack."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "docker-compose.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the "KEY=value" list form is valid compose too
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_services_exist(compose: dict[str, Any]) -> None:
    assert {"kafka", "redis", "millstream"} <= set(compose["services"])


def test_kafka_is_a_single_kraft_node(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == "apache/kafka:3.8.0"
    env = _env(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    # One broker: internal topics (offsets, transaction state) must not ask for 3 replicas.
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert len(env["CLUSTER_ID"]) == 22  # KRaft wants a base64 UUID
    assert "healthcheck" in kafka


def test_redis_is_durable(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert str(redis["image"]).startswith("redis:7")
    command = redis["command"]
    command = command.split() if isinstance(command, str) else [str(c) for c in command]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    assert "healthcheck" in redis


def test_millstream_runs_the_demo_against_both(compose: dict[str, Any]) -> None:
    app = compose["services"]["millstream"]
    assert app["build"]["dockerfile"] == "docker/Dockerfile"
    assert (COMPOSE.parent / app["build"]["context"]).resolve() == REPO
    command = app["command"]
    assert (command.split() if isinstance(command, str) else command)[:2] == ["millstream", "demo"]
    env = _env(app)
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert env["REDIS_URL"] == "redis://redis:6379/0"
    depends = app["depends_on"]
    assert {"kafka", "redis"} <= set(depends)
    if isinstance(depends, dict):
        assert all(depends[name]["condition"] == "service_healthy" for name in ("kafka", "redis"))


def test_millstream_environment_passes_settings_validation(compose: dict[str, Any]) -> None:
    from millstream.settings import Settings

    settings = Settings.from_env(_env(compose["services"]["millstream"]))
    assert settings.kafka_bootstrap_servers == "kafka:9092"
    assert settings.embedded == "never"  # the stack provides both services


def test_dockerfile_installs_the_package_with_java() -> None:
    text = DOCKERFILE.read_text()
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    ]
    assert lines[0].startswith("FROM python:3.11-slim")
    assert "openjdk-17-jre-headless" in text
    assert any(line.startswith("RUN pip install") and '"."' not in line for line in lines)
    assert 'pip install ".[demo]"' in text
    for folder in ("millstream", "connectors", "injectors", "sinks", "state"):
        assert f"COPY {folder}/ {folder}/" in text, f"{folder}/ is not copied into the image"
        assert (REPO / folder).is_dir()
    assert "pyproject.toml" in text


def _compose_available() -> bool:
    if not shutil.which("docker"):
        return False
    probe = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


def test_docker_compose_config_is_valid() -> None:
    if not _compose_available():
        pytest.skip("`docker compose` is not installed here; the YAML checks above still ran")
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
