"""A Kafka sink's client settings: given to its constructor, or bound to its application's.

`KafkaTransactionalSink(topic="out")` names no cluster. The runtime binds it (`Sink.bind`) on
the driver, before the sink is shipped to executors, to the Kafka settings of the application
that runs it, so a topology module needs none at import time: the embedded broker does not even
exist before `millstream run` starts it. Settings given to the constructor are kept as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from millstream.errors import ConfigurationError
from millstream.sinks._kafka import check_owned, client_config


class KafkaSettings:
    """What a Kafka sink builds its clients from; ConfigurationError on use while unbound.

    `connection` is the cluster part (bootstrap servers, security) for admin and consumer
    clients; `producer` adds the producer tuning and the settings the sink owns; `cache_key`
    names that producer configuration in per-process client caches.
    """

    def __init__(
        self,
        owner: str,
        kafka_config: Mapping[str, str] | None,
        producer_config: Mapping[str, Any] | None,
        owned: Mapping[str, Any],
    ) -> None:
        if kafka_config is not None and not isinstance(kafka_config, Mapping):
            raise ConfigurationError(
                f"{owner}: kafka_config must be a mapping of librdkafka settings, got "
                f"{type(kafka_config).__name__}; to name only the topic write {owner}(topic=...)"
            )
        self.owner = owner
        self._producer_config = dict(producer_config or {})
        self._owned = dict(owned)
        check_owned(self._producer_config, self._owned)  # at construction, bound or not
        self._connection = None if kafka_config is None else dict(kafka_config)
        self._producer: dict[str, Any] | None = None
        self._cache_key: tuple[tuple[str, str], ...] = ()
        if self._connection is not None:
            self._producer = client_config(self._connection, self._producer_config, self._owned)
            self._cache_key = tuple(sorted((k, str(v)) for k, v in self._producer.items()))

    @property
    def bound(self) -> bool:
        return self._connection is not None

    def bind(self, kafka_config: Mapping[str, str]) -> KafkaSettings:
        """These settings when the sink was given some, else the application's."""
        if self.bound:
            return self
        return KafkaSettings(self.owner, kafka_config, self._producer_config, self._owned)

    @property
    def connection(self) -> dict[str, Any]:
        if self._connection is None:
            raise self._unbound()
        return self._connection

    @property
    def producer(self) -> dict[str, Any]:
        if self._producer is None:
            raise self._unbound()
        return self._producer

    @property
    def cache_key(self) -> tuple[tuple[str, str], ...]:
        if self._producer is None:
            raise self._unbound()
        return self._cache_key

    def _unbound(self) -> ConfigurationError:
        return ConfigurationError(
            f"{self.owner} has no Kafka settings: add it to a Topology (`topology.sink(...)`), "
            "whose application gives it its own (KAFKA_BOOTSTRAP_SERVERS and MILLSTREAM_KAFKA_*, "
            f"or the embedded broker), or pass them: {self.owner}(Settings.from_env()"
            ".kafka_config(), topic=...)"
        )
