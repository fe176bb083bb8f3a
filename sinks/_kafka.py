"""Private helpers shared by the sinks: topic mapping, owned client settings, client caches.

The header format is `millstream.headers`; error classification `millstream.kafka_errors`;
topic and security checks at start-up `millstream.kafka_admin`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from confluent_kafka import KafkaException

from millstream.errors import ConfigurationError

TopicFor = str | Mapping[str, str] | Callable[[str], str]

# librdkafka settings the sinks own: a user override would silently break the guarantees.
_OWNED = {"enable.idempotence", "acks", "transactional.id", "isolation.level"}


def resolve_topic(topic_for: TopicFor, stream: str) -> str:
    """Map a stream name to its topic: one topic, a dict, or a function of the stream name."""
    if isinstance(topic_for, str):
        return topic_for
    if isinstance(topic_for, Mapping):
        try:
            return topic_for[stream]
        except KeyError:
            raise ConfigurationError(
                f"no topic for stream {stream!r}: add it to the sink's topic mapping"
            ) from None
    topic = topic_for(stream)
    if not isinstance(topic, str) or not topic:
        raise ConfigurationError(f"topic_for({stream!r}) returned {topic!r}: expected a topic name")
    return topic


def topic_mapping(owner: str, topic_for: TopicFor | None, topic: str | None) -> TopicFor:
    """A sink's stream-to-topic mapping from its constructor: `topic=` or `topic_for`, one."""
    if (topic_for is None) == (topic is None):
        raise ConfigurationError(
            f"{owner}: give exactly one of topic='name' (one output topic) or topic_for (a topic, "
            "a dict stream -> topic, or a function of the stream)"
        )
    chosen = topic if topic is not None else topic_for
    assert chosen is not None  # exactly one was given
    return chosen


def static_topics(topic_for: TopicFor) -> list[str]:
    """Topics known before any delivery (a function of the stream is only known lazily)."""
    if isinstance(topic_for, str):
        return [topic_for]
    if isinstance(topic_for, Mapping):
        return sorted(set(topic_for.values()))
    return []


def client_config(
    base: Mapping[str, str], extra: Mapping[str, Any] | None, owned: Mapping[str, Any]
) -> dict[str, Any]:
    """Merge user settings with the ones the sink must own; refuse conflicting overrides."""
    if "bootstrap.servers" not in base:
        raise ConfigurationError(
            "the sink's Kafka config has no bootstrap.servers: pass Settings.kafka_config()"
        )
    merged: dict[str, Any] = {**base, **(extra or {})}
    check_owned(merged, owned)
    merged.update(owned)
    return merged


def check_owned(settings: Mapping[str, Any], owned: Mapping[str, Any]) -> None:
    """Refuse a user setting that would silently weaken a guarantee the sink owns."""
    for name, value in owned.items():
        given = settings.get(name)
        if name in _OWNED and given is not None and str(given).lower() != str(value).lower():
            raise ConfigurationError(
                f"Kafka setting {name}={given!r} conflicts with the sink's guarantee "
                f"({name}={value!r}): remove it from the sink's config"
            )


def purge_quietly(producer: Any) -> None:
    """Drop what a producer still queues or has in flight, ignoring a broken handle.

    For a producer being given up (fenced, fatal, stuck): what it holds belongs to a failed
    delivery whose productions stay checkpointed. Not Producer.close(): on a fenced producer it
    blocks forever (confluent-kafka 2.16); dropping the last reference destroys the handle.
    """
    with contextlib.suppress(KafkaException, SystemError, RuntimeError):
        producer.purge(in_queue=True, in_flight=True, blocking=False)


V = TypeVar("V")


class ProcessCache(Generic[V]):
    """Clients cached per Python process: Spark reuses worker processes across batches.

    A forked child must not reuse its parent's librdkafka handle, so entries are keyed by pid.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[int, Any], V] = {}

    def get(self, key: Any) -> V | None:
        with self._lock:
            return self._items.get((os.getpid(), key))

    def put(self, key: Any, value: V) -> V:
        with self._lock:
            return self._items.setdefault((os.getpid(), key), value)

    def pop(self, key: Any) -> V | None:
        with self._lock:
            return self._items.pop((os.getpid(), key), None)

    def drain(self, match: Callable[[Any], bool]) -> list[V]:
        """Remove and return this process's entries whose key matches."""
        pid = os.getpid()
        with self._lock:
            keys = [k for k in self._items if k[0] == pid and match(k[1])]
            return [self._items.pop(k) for k in keys]


class Deadline:
    """A monotonic deadline: every retry loop in the sinks is bounded by one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end
