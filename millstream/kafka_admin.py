"""Start-up questions to a Kafka cluster: which topics exist, their partitions, fitting security.

Used by the runtime (internal topics, input partition counts) and by the sinks (output topics)
alike, so it belongs to neither layer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from millstream.errors import ConfigurationError, TransientError
from millstream.kafka_errors import classify

__all__ = ["admin_metadata", "check_topics", "redact"]

_log = logging.getLogger(__name__)

# librdkafka log lines and errors that mean "these security settings do not fit the listener".
_SECURITY_SIGNS = (
    "SSL_HANDSHAKE",
    "SSL handshake",
    "AUTH_HANDSHAKE",
    "AUTH_REQ",
    "SASL",
    "security.protocol",  # librdkafka's hint: "might be caused by incorrect security.protocol"
)
_SECURITY_CODES = {KafkaError._AUTHENTICATION, KafkaError._SSL}
_PROBE_SETUP_TIMEOUT_MS = 10_000
# Every bootstrap broker refusing or unresolvable this long at start-up: nothing listens there.
# Long enough for a broker that starts beside the pipeline; a slow broker gets the full timeout.
ALL_DOWN_FAIL_S = 10.0
_SECRET_KEY_WORDS = ("password", "secret", "token", "jaas", "key")


def redact(text: str, config: Mapping[str, Any]) -> str:
    """`text` with the value of every secret-looking client setting replaced by ***."""
    for name, value in config.items():
        if any(w in name.lower() for w in _SECRET_KEY_WORDS) and isinstance(value, str) and value:
            text = text.replace(value, "***")
    return text


class _Watch:
    """Collects librdkafka errors and log lines of one client, served by its `poll()`."""

    def __init__(self) -> None:
        self.errors: list[KafkaError] = []
        self.lines: list[str] = []
        self.all_down_since: float | None = None

    def error(self, err: KafkaError) -> None:
        self.errors.append(err)
        if err.code() == KafkaError._ALL_BROKERS_DOWN and self.all_down_since is None:
            self.all_down_since = time.monotonic()

    def log(self, level: int, fmt: str, *args: Any) -> None:  # the `logger` protocol
        line = fmt % args if args else fmt
        self.lines.append(line)
        _log.log(max(level, logging.DEBUG), "librdkafka: %s", line)

    def security_problem(self) -> str | None:
        for err in self.errors:
            if err.code() in _SECURITY_CODES:
                return str(err.str())
        for line in self.lines:
            if "FAIL" in line and any(sign in line for sign in _SECURITY_SIGNS):
                return line.split("]: ", 1)[-1]
        return None


def admin_metadata(config: Mapping[str, Any], timeout: float) -> tuple[AdminClient, Any]:
    """An AdminClient for `config` and the cluster metadata, failing fast on security mistakes.

    librdkafka keeps retrying a TLS or SASL handshake that cannot succeed (TLS against a
    plaintext listener, a wrong SASL mechanism, bad credentials) and reports a bare "transport
    failure" when the timeout ends. Its logs and error callback name the real cause much
    earlier; this raises ConfigurationError with it (secrets redacted) as soon as it appears.
    Raises KafkaException when the broker does not answer within `timeout` for another reason,
    or sooner, once every bootstrap broker has refused or failed to resolve for ALL_DOWN_FAIL_S.

    For start-up checks (`ensure_topics`) only: a broker restarting mid-handshake would read as
    a security mistake too, so clients that must ride out broker restarts do not use this.
    """
    watch = _Watch()
    settings: dict[str, Any] = {
        "socket.connection.setup.timeout.ms": _PROBE_SETUP_TIMEOUT_MS,
        **config,
        "error_cb": watch.error,
        "logger": watch,
    }
    where = f"Kafka at {config.get('bootstrap.servers')}"
    try:
        admin = AdminClient(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid Kafka client settings for {where} ({redact(str(exc), config)}): fix the "
            "MILLSTREAM_KAFKA_* variables"
        ) from None
    deadline = time.monotonic() + timeout
    wait = 1.0  # grows to 5 s: a big cluster's metadata may take longer than the first slice
    while True:
        try:
            return admin, admin.list_topics(
                timeout=min(wait, max(0.05, deadline - time.monotonic()))
            )
        except KafkaException:
            wait = min(wait * 2, 5.0)
            admin.poll(0)  # serves the error callback and the log lines
            problem = watch.security_problem()
            if problem is not None:
                protocol = config.get("security.protocol", "plaintext")
                raise ConfigurationError(
                    f"{where}: the TLS/SASL handshake failed ({redact(problem, config)}) with "
                    f"security.protocol={protocol}: set MILLSTREAM_KAFKA_SECURITY_PROTOCOL (and the "
                    "ssl.* / sasl.* settings) to what the broker's listener expects"
                ) from None
            down = watch.all_down_since
            if time.monotonic() >= deadline or (
                down is not None and time.monotonic() - down >= ALL_DOWN_FAIL_S
            ):
                raise


def check_topics(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float
) -> dict[str, int]:
    """Partition count per topic; ConfigurationError when one is missing or not authorised.

    `config` is the connection part only (bootstrap servers and security), not producer tuning.

    Topics must exist beforehand: some brokers (Tansu) auto-create a missing topic with default
    settings on first produce, which hides a typo and picks the wrong partition count.
    """
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin = AdminClient(dict(config))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TransientError(
            f"Kafka at {config.get('bootstrap.servers')} did not answer a metadata request "
            f"within {timeout:.0f}s ({exc}): check the bootstrap servers and that the broker runs"
        ) from None
    counts: dict[str, int] = {}
    for topic in wanted:
        meta = metadata.topics.get(topic)
        if meta is None:
            raise ConfigurationError(
                f"topic {topic!r} does not exist on {config.get('bootstrap.servers')}: create it "
                "(for example `kafka-topics.sh --create --topic "
                f"{topic} --partitions N`) before starting the pipeline"
            )
        if meta.error is not None:
            raise classify(meta.error, f"topic {topic!r}")
        counts[topic] = len(meta.partitions)
    return counts


def end_offsets(
    config: Mapping[str, Any], topic: str, partitions: int, timeout: float
) -> dict[int, int]:
    """Each partition's high watermark (the offset the next record will get)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**config, "group.id": "millstream-end-offsets", "enable.auto.commit": False}
    )
    try:
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1])
            for p in range(partitions)
        }
    finally:
        consumer.close()
