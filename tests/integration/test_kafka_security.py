"""MILLSTREAM_KAFKA_* security settings that do not fit the broker fail start-up fast and clearly.

The test broker has a plaintext listener only, so `security.protocol=SSL` (or SASL) can never
connect. Before, topic creation waited its whole 30 s timeout and then said "unreachable";
now the TLS/SASL handshake failure is named within about 10 s, with `security.protocol` and the
variable to fix, and the SASL password (a `tests.secrets` value) appears nowhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from millstream.connectors.topics import ensure_topics
from millstream.errors import ConfigurationError
from millstream.settings import Settings
from tests.secrets import KAFKA_SASL_PASSWORD, MARKER

# The old behaviour: list_topics waited this long, then reported a bare transport failure.
METADATA_TIMEOUT_S = 30.0
FAST_S = 25.0


def _env(bootstrap: str, protocol: str, mechanism: str = "PLAIN") -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "MILLSTREAM_KAFKA_SECURITY_PROTOCOL": protocol,
        "MILLSTREAM_KAFKA_SASL_MECHANISM": mechanism,
        "MILLSTREAM_KAFKA_SASL_USERNAME": "millstream-svc",
        "MILLSTREAM_KAFKA_SASL_PASSWORD": KAFKA_SASL_PASSWORD,
    }


def test_plaintext_settings_work_against_the_broker(kafka_bootstrap: str) -> None:
    """Guards the failures below: the same call with the broker's real protocol succeeds."""
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    topic = f"security-ok-{uuid.uuid4().hex[:12]}"
    ensure_topics(settings.kafka_config(), {topic: 1}, timeout=METADATA_TIMEOUT_S)


@pytest.mark.parametrize(
    ("protocol", "mechanism", "cause"),
    [
        pytest.param("SSL", "PLAIN", "SSL_HANDSHAKE", id="tls-against-plaintext"),
        pytest.param("SASL_SSL", "SCRAM-SHA-512", "SSL_HANDSHAKE", id="sasl-tls-against-plaintext"),
        pytest.param("SASL_PLAINTEXT", "SCRAM-SHA-512", "SASL", id="sasl-against-plaintext"),
    ],
)
def test_topic_creation_fails_fast_naming_the_security_settings(
    kafka_bootstrap: str,
    protocol: str,
    mechanism: str,
    cause: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    settings = Settings.from_env(_env(kafka_bootstrap, protocol, mechanism))
    topic = f"security-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as caught:
        ensure_topics(settings.kafka_config(), {topic: 1}, timeout=METADATA_TIMEOUT_S)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert elapsed < FAST_S, f"took {elapsed:.1f}s: {message}"
    assert f"security.protocol={protocol}" in message, message
    assert "MILLSTREAM_KAFKA_SECURITY_PROTOCOL" in message, message
    assert cause in message, message
    assert kafka_bootstrap in message, message
    out, err = capfd.readouterr()  # librdkafka's own log lines included
    assert MARKER not in message + out + err


@pytest.mark.slow  # starts Spark before it reaches Kafka
def test_millstream_run_with_ssl_against_plaintext_exits_with_one_clear_error(
    kafka_bootstrap: str, redis_url: str, redis_namespace: str, tmp_path: Path
) -> None:
    """The whole start-up path: env -> Settings -> endpoints -> topic creation -> exit 2."""
    (tmp_path / "secpipeline.py").write_text(
        "from millstream import Computation, Topology, kafka_source\n"
        "\n"
        "class Noop(Computation):\n"
        "    def process_record(self, ctx, record):\n"
        "        pass\n"
        "\n"
        "topology = Topology('secapp')\n"
        "topology.source('in', kafka_source('secapp-input'))\n"
        "topology.computation('noop', Noop(), inputs=['in'], outputs=['out'])\n"
    )
    script = Path(sys.executable).with_name("millstream")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "millstream.cli"]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MILLSTREAM_") and k not in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")
    }
    env.update(_env(kafka_bootstrap, "SSL"))
    env.update(
        {
            "REDIS_URL": redis_url,
            "MILLSTREAM_APP": redis_namespace,
            "MILLSTREAM_EMBEDDED": "never",
            "MILLSTREAM_STATE_DIR": str(tmp_path / "state"),
            "MILLSTREAM_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    result = subprocess.run(
        [*command, "run", "secpipeline:topology"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # Spark and librdkafka log to stderr too; millstream's own error is exactly one line.
    errors = [line for line in result.stderr.splitlines() if line.startswith("millstream: ")]
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr[-3000:])
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith("millstream: error: Kafka at "), errors[0]
    assert "security.protocol=SSL" in errors[0], errors[0]
    assert "MILLSTREAM_KAFKA_SECURITY_PROTOCOL" in errors[0], errors[0]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert MARKER not in result.stdout + result.stderr
