"""Steps 5 and 6 on the driver: deliver what the shard tasks committed, then acknowledge it.

Why the driver: a transactional sink keeps one producer per shard, whose `transactional.id`
lets Kafka fence zombies. Spark gives a shard task whichever Python worker is free, so a
producer cached in a worker was initialised again (`init_transactions`, about 200 ms on the
embedded broker) for most transactions, each time fencing the other worker's producer. The
driver is one long-lived process: each shard's producer is initialised once.

Exactly-once is unchanged. The shard tasks commit state, ids and checkpointed productions as
before and return those checkpoints with the lease they committed under. The driver delivers
each shard's checkpoints (shards in parallel threads: librdkafka waits without the GIL) and
acknowledges them in a commit guarded by that lease. A delivery or an acknowledgement that
fails leaves the checkpoints in Redis: the shard's next task returns them again (a
transactional sink skips what its progress says it delivered; internal streams are deduplicated
by id downstream), and until then they hold the computation's low watermark.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from millstream.connectors.delivery import deliver_all
from millstream.connectors.plan import BatchPlan
from millstream.errors import ConfigurationError, FencedError, MillstreamError
from millstream.state.keys import ShardKeys
from millstream.state.shard import acknowledge

if TYPE_CHECKING:
    from millstream.connectors.shard_task import ShardResult

log = logging.getLogger(__name__)
MAX_THREADS = 8


class DriverDelivery:
    """Delivers one computation's shard outputs from the driver, shards in parallel."""

    def __init__(self, computation: str, shards: int, client: Any) -> None:
        self.computation = computation
        self.client = client
        self._pool = ThreadPoolExecutor(
            max_workers=min(shards, MAX_THREADS),
            thread_name_prefix=f"millstream-deliver-{computation}",
        )

    def deliver(self, plan: BatchPlan, results: list[ShardResult]) -> dict[str, int]:
        """Deliver and acknowledge every shard's outstanding productions; returns counters.

        Raises ConfigurationError (nothing will work until it is fixed); any other delivery
        failure is logged and counted, and its checkpoints stay for the next batch.
        """
        futures = [self._pool.submit(self._shard, plan, r) for r in results if r.outstanding]
        totals: dict[str, int] = {}
        for future in futures:
            for name, amount in future.result().items():
                totals[name] = totals.get(name, 0) + amount
        return totals

    def _shard(self, plan: BatchPlan, result: ShardResult) -> dict[str, int]:
        keys = ShardKeys(plan.app, self.computation, result.shard)
        assert result.lease is not None, "a shard result with outstanding productions has a lease"
        try:
            delivered = deliver_all(plan, self.computation, result.shard, result.outstanding)
        except ConfigurationError:
            raise
        except (MillstreamError, KafkaException) as exc:
            log.warning("shard %s: delivery failed, will retry: %s", keys.tag, exc)
            return {"delivery_failures": 1}
        try:
            acknowledge(self.client, keys, result.lease, delivered, {"delivered": len(delivered)})
        except FencedError as exc:
            # A newer owner (a speculative copy, a zombie's re-run) holds the shard: it read
            # these checkpoints and delivers them again, which the sinks make harmless.
            log.warning("shard %s: delivered, not acknowledged (%s)", keys.tag, exc)
            return {"delivered": len(delivered), "acks_fenced": 1}
        except MillstreamError as exc:
            log.warning(
                "shard %s: delivered, acknowledgement failed, will retry: %s", keys.tag, exc
            )
            return {"delivered": len(delivered), "ack_failures": 1}
        return {"delivered": len(delivered), "redelivered": result.redelivered}
