"""The sink contract: how the runtime hands checkpointed productions to an output.

The runtime calls, per shard and micro-batch, after the Redis commit::

    report = sink.deliver(shard, productions)

`productions` are all productions of that shard currently checkpointed for this sink, sorted by
`seq`; after a crash they include some an earlier attempt may already have delivered. When
`deliver` returns, the runtime deletes those checkpoints, so a sink returns only once every
production is durably delivered (or known to be delivered already) and raises otherwise:

- `TransientError` (or its `BackpressureError`): retriable, but retries ran out; the
  checkpoints stay and the next batch delivers them again.
- `FencedError`: a newer writer took over this shard's output; stop, never retry.
- `ConfigurationError`: nothing will work until the configuration is fixed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple, Self

from millstream.errors import TransientError
from millstream.records import Production

SKIPPED_DELIVERED = "already delivered"
SKIPPED_SUPERSEDED = "superseded by a newer value"


class BackpressureError(TransientError):
    """The output did not drain within the deadline (for example a full producer queue).

    Retriable: the runtime should slow down (smaller batches, later trigger) and deliver again.
    """


@dataclass(frozen=True, slots=True)
class ShardRef:
    """Which shard's productions a delivery carries: (app, computation, shard)."""

    app: str
    computation: str
    shard: int

    def __str__(self) -> str:
        return f"{self.app}.{self.computation}.{self.shard}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """What happened to one production.

    `topic` is where it went: a Kafka topic, a Redis key or a file path. `partition` and
    `offset` are set for Kafka (offset is the line number for files). `skipped` is None for a
    production written by this call, else the reason it was not written again.
    """

    id: bytes
    seq: int
    topic: str | None
    partition: int | None = None
    offset: int | None = None
    skipped: str | None = None


class PartitionProgress(NamedTuple):
    """Per (topic, partition): the highest offset written and the oldest times written there.

    A tuple so callers may unpack it: `max_offset, min_event_time, min_system_time = p`.
    """

    max_offset: int
    min_event_time: int
    min_system_time: int


@dataclass(frozen=True)
class DeliveryReport:
    """The outcome of one `deliver` call, in the order of the productions given.

    `partitions` covers Kafka records this call wrote: the runtime records them as in flight
    so consumers' low watermarks wait until those records are read.
    """

    shard: ShardRef
    deliveries: tuple[Delivery, ...] = ()
    partitions: Mapping[tuple[str, int], PartitionProgress] = field(default_factory=dict)

    @property
    def delivered(self) -> int:
        return sum(1 for d in self.deliveries if d.skipped is None)

    @property
    def skipped(self) -> int:
        return sum(1 for d in self.deliveries if d.skipped is not None)

    @classmethod
    def build(cls, shard: ShardRef, pairs: Iterable[tuple[Production, Delivery]]) -> DeliveryReport:
        """Assemble a report and the per-partition summary from (production, outcome) pairs."""
        deliveries: list[Delivery] = []
        parts: dict[tuple[str, int], PartitionProgress] = {}
        for production, delivery in pairs:
            deliveries.append(delivery)
            if delivery.skipped is not None or delivery.partition is None:
                continue
            if delivery.topic is None or delivery.offset is None:
                continue
            tp = (delivery.topic, delivery.partition)
            old = parts.get(tp)
            parts[tp] = (
                PartitionProgress(delivery.offset, production.timestamp, production.system_time)
                if old is None
                else PartitionProgress(
                    max(old.max_offset, delivery.offset),
                    min(old.min_event_time, production.timestamp),
                    min(old.min_system_time, production.system_time),
                )
            )
        return cls(shard, tuple(deliveries), parts)


class Sink(ABC):
    """An output for checkpointed productions.

    Lifecycle: `bind()` on the driver when the application starts, `setup()` once per process
    before the first delivery (validate, fail fast with the cause and the fix), `deliver()` per
    shard and batch, `close()` at shutdown. Instances are built on the driver and shipped to
    executors, so constructors only store settings: clients are created lazily and cached per
    process.
    """

    # True when the sink keeps a producer per shard whose start is costly and fences the shard's
    # previous producer (a Kafka transactional.id): computations with `delivery="auto"` then
    # deliver from the driver, one long-lived process, instead of from whichever worker runs
    # the shard's task.
    keeps_shard_producers: bool = False

    def bind(self, kafka_config: Mapping[str, str]) -> Self:
        """The sink to run in an application whose Kafka settings are `kafka_config`.

        Called by the runtime on the driver before the sink is shipped and set up. A sink built
        without the settings it needs (`KafkaTransactionalSink(topic="out")`) returns a copy
        that uses these; one given its own keeps them. This default needs none: itself.
        """
        return self

    def setup(self) -> None:  # noqa: B027 - optional hook, nothing to check by default
        """Check that the output is usable; raise ConfigurationError naming cause and fix."""

    @abstractmethod
    def deliver(self, shard: ShardRef, productions: Sequence[Production]) -> DeliveryReport:
        """Deliver every production durably, or raise; see the module docstring."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; never leaves a Kafka transaction open. The runtime calls it on the
        driver when the application stops."""

    def __enter__(self) -> Sink:
        self.setup()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def bind_sink(sink: Any, kafka_config: Mapping[str, str]) -> Any:
    """The runtime's binding rule for any sink object: its `bind(kafka_config)`, or the object
    itself when it has none (a sink that does not subclass `Sink` and needs no settings)."""
    bind = getattr(sink, "bind", None)
    return bind(kafka_config) if callable(bind) else sink
