"""Hand-over and settlement: what happens to a shard's committed productions in a batch.

*Hand over*: a committed production on a stream that computations of this query consume
becomes their input row later in the same batch. Its position (producer, shard, seq) is fixed
at the checkpoint, so one handed over again after a crash is a replay to the consumer's
catalog, and is dropped.

*Settle*: deliver what leaves the application (sinks, dead letters, published streams), then
acknowledge the shard's checkpoints under the lease they were committed with, once every
consumer here committed them and every external target took them (MillWheel's strong
productions). A shard whose productions nothing here consumes is settled as soon as it
committed, in a thread, while the computations after it run; the batch ends when every
settlement did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass

from millstream.connectors.delivery import RETRIED, deliver_all
from millstream.connectors.plan import BatchPlan
from millstream.connectors.shard_task import ShardResult
from millstream.connectors.stage_plan import Stage
from millstream.errors import ConfigurationError, FencedError, MillstreamError
from millstream.records import Production
from millstream.state.client import REDIS_ERRORS, RedisClient
from millstream.state.keys import ShardKeys
from millstream.state.shard import acknowledge

log = logging.getLogger(__name__)
DELIVERY_THREADS = 8
# A failed acknowledgement is retried by the next batch: the checkpoints stay where they are.
_ACK_RETRIED: tuple[type[Exception], ...] = (MillstreamError, *REDIS_ERRORS)


@dataclass
class Done:
    """A shard's committed, unacknowledged productions after its task: what the end of the
    batch delivers outside and acknowledges."""

    stage: Stage
    plan: BatchPlan
    result: ShardResult


def handed_row(producer: str, shard: int, production: Production) -> tuple:
    """A checkpointed production as a consumer's input row (same columns as an injected row)."""
    return (
        production.stream,
        production.id,
        production.key.encode("utf-8", "surrogatepass"),
        production.value,
        production.timestamp,
        production.system_time,
        producer,
        shard,
        production.seq,
        list(production.headers),
        None,
    )


def hand_over(
    stage: Stage, plan: BatchPlan, results: list[ShardResult], handed: dict[str, list[tuple]]
) -> list[Done]:
    """Committed productions become consumers' input rows later in this batch (`handed`);
    every shard with checkpoints is settled (delivered outside, acknowledged) at the end."""
    done = []
    for result in results:
        if result.outstanding:
            done.append(Done(stage, plan, result))
        for production in result.outstanding:
            if production.stream in stage.consumers:
                handed.setdefault(production.stream, []).append(
                    handed_row(stage.name, result.shard, production)
                )
    return done


class Settlement:
    """Delivers and acknowledges shards' productions, in a pool of threads (one long-lived
    process: each shard's transactional producer is initialised once)."""

    def __init__(self, client: RedisClient, app: str) -> None:
        self.client = client
        self.app = app
        self.pool = ThreadPoolExecutor(DELIVERY_THREADS, thread_name_prefix="millstream-deliver")
        # A batch's end (settle, then record it) running behind it while Spark starts the
        # next batch; the next one waits for it (`wait_behind`) before it does anything.
        self._closer = ThreadPoolExecutor(1, thread_name_prefix="millstream-batch-end")
        self._behind: Future[None] | None = None

    def run_behind(self, end: Callable[[], None]) -> None:
        """Run a batch's end in the background: its productions are checkpointed in Redis
        already, so a crash before it finishes loses nothing (the next owner of each shard
        delivers them again: MillWheel's strong productions)."""
        self._behind = self._closer.submit(end)

    def wait_behind(self) -> None:
        """Wait for the previous batch's end; raise what it raised. Before the next batch
        reads, counts its backlog or runs a shard: a shard task must not find the previous
        batch's productions still pending (it would deliver them again)."""
        behind, self._behind = self._behind, None
        if behind is not None:
            behind.result()

    def shutdown(self) -> None:
        """Let a running batch end finish (its deliveries and acknowledgements), then release
        the threads; what it raised is logged (a next start delivers what it could not)."""
        try:
            self.wait_behind()
        except Exception as exc:
            log.warning("the last batch's delivery failed; its next start delivers it: %s", exc)
        self._closer.shutdown(wait=True)
        self.pool.shutdown(wait=False)

    def start(self, item: Done) -> Future[dict[str, int]]:
        return self.pool.submit(self.settle, item)

    def finish(
        self, done: list[Done], settling: Sequence[tuple[Done, Future[dict[str, int]]]] = ()
    ) -> dict[str, dict[str, int]]:
        """Settle `done`, and wait for the settlements started earlier in the batch
        (`settling`): a batch ends with every production it checkpointed delivered or its
        failure noted. Returns counters per computation."""
        futures = [*settling, *((d, self.start(d)) for d in done)]
        # Every settlement ends before the batch does, even when one raised: a re-run of the
        # batch must not deliver a shard while this one still does.
        futures_wait([future for _, future in futures])
        out: dict[str, dict[str, int]] = {}
        for item, future in futures:
            totals = out.setdefault(item.stage.name, {})
            for name, amount in future.result().items():
                totals[name] = totals.get(name, 0) + amount
        return out

    def settle(self, item: Done) -> dict[str, int]:
        stage, result = item.stage, item.result
        keys = ShardKeys(self.app, stage.name, result.shard, item.plan.generation)
        outside = [p for p in result.outstanding if stage.targets.get(p.stream)]
        inside_only = [p for p in result.outstanding if not stage.targets.get(p.stream)]
        settled = list(inside_only)  # every consumer committed them: the batch got here
        counters: dict[str, int] = {}
        if outside:
            try:
                # The operator's say first (a join's registry insert): some are acknowledged
                # without delivery.
                outside, skipped, gated = stage.spec.operator.before_delivery(
                    item.plan, stage.name, result.shard, outside
                )
                settled += skipped
                counters.update(gated)
                settled += deliver_all(item.plan, stage.name, result.shard, outside)
                counters["delivered"] = len(outside)
            except ConfigurationError:
                raise
            except RETRIED as exc:
                log.warning("shard %s: delivery failed, will retry: %s", keys.tag, exc)
                counters["delivery_failures"] = 1
        if inside_only:
            counters["handed_over"] = len(inside_only)
        if not settled:
            return counters
        assert result.lease is not None, "a shard result with outstanding productions has a lease"
        try:
            acknowledge(
                self.client,
                keys,
                result.lease,
                settled,
                {"acknowledged": len(settled)},
                result.outstanding,
            )
        except FencedError as exc:
            # A newer owner holds the shard: it hands over and delivers these again, and
            # consumers and sinks drop what they already have.
            log.warning("shard %s: settled, not acknowledged (%s)", keys.tag, exc)
            counters["acks_fenced"] = 1
        except _ACK_RETRIED as exc:  # a failover, a Redis restart
            log.warning("shard %s: acknowledgement failed, will retry: %s", keys.tag, exc)
            counters["ack_failures"] = 1
        else:
            counters["redelivered"] = result.redelivered
        return counters
