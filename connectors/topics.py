"""Topics around a pipeline: internal streams' created with a sensible partition count when
missing; input topics checked, never created."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from millstream.errors import ConfigurationError, TransientError
from millstream.kafka_admin import admin_metadata

# Explicit retention: some clients fail on topics whose config lacks it (INFRA.md).
TOPIC_CONFIG = {"retention.ms": str(7 * 24 * 3600 * 1000), "cleanup.policy": "delete"}


def ensure_topics(
    kafka: Mapping[str, str], topics: Mapping[str, int], timeout: float = 30.0
) -> None:
    """Create each missing topic with its partition count; existing topics are left as they are.

    The first Kafka contact of `millstream run`: security settings that do not fit the broker
    raise ConfigurationError here within seconds (`admin_metadata`), not after `timeout`.
    """
    try:
        admin, metadata = admin_metadata(kafka, timeout)
        existing = set(metadata.topics)
    except KafkaException as exc:
        raise TransientError(
            f"Kafka at {kafka.get('bootstrap.servers')} is unreachable ({exc}); "
            "check KAFKA_BOOTSTRAP_SERVERS and that the broker runs."
        ) from None
    missing = [
        NewTopic(name, num_partitions=parts, replication_factor=-1, config=dict(TOPIC_CONFIG))
        for name, parts in topics.items()
        if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result()
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ConfigurationError(
                    f"cannot create topic {name!r} ({exc}): create it yourself or grant "
                    "CreateTopics on the cluster"
                ) from None
    deadline = time.monotonic() + timeout
    wanted = {t.topic for t in missing}
    while time.monotonic() < deadline:
        if wanted <= set(admin.list_topics(timeout=timeout).topics):
            return
        time.sleep(0.1)
    raise TransientError(f"topics {sorted(wanted)} were not visible after {timeout:.0f}s")


def check_input_topics(
    kafka: Mapping[str, str], inputs: Iterable[tuple[str, str]], timeout: float = 30.0
) -> None:
    """Each `(stream, topic)` a Kafka injector reads must exist: a missing one fails the start
    with one line naming it, before the JVM starts (in the query it would fail four times,
    with Spark's stack traces, before the run gave up)."""
    wanted = sorted(set(inputs))
    if not wanted:
        return
    try:
        _, metadata = admin_metadata(kafka, timeout)
    except KafkaException as exc:
        raise TransientError(
            f"Kafka at {kafka.get('bootstrap.servers')} is unreachable ({exc}); "
            "check KAFKA_BOOTSTRAP_SERVERS and that the broker runs."
        ) from None
    for stream, topic in wanted:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            why = "does not exist" if meta is None else f"cannot be read ({meta.error.str()})"
            raise ConfigurationError(
                f"input topic {topic!r} of stream {stream!r} {why} on "
                f"{kafka.get('bootstrap.servers')}: create it first (millstream never creates "
                "input topics), or fix the source's topics option"
            )
