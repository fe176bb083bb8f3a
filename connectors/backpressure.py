"""Backpressure: a computation whose outputs cannot be delivered stops taking new input.

When a target is slow or down, deliveries fail and productions stay checkpointed in Redis (they
hold the computation's low watermark meanwhile). Left alone, the next micro-batches would keep
processing new input and piling up checkpoints without bound. So before a micro-batch is
processed, the driver counts each shard's outstanding productions; while any shard holds more
than `MILLSTREAM_MAX_PENDING_PRODUCTIONS`, it runs delivery-only shard tasks (acquire ->
re-deliver the checkpoints -> acknowledge; no input, no timers) with backoff, and processes the
micro-batch only once every shard is back under the limit. A `foreachBatch` that has not
returned makes Spark read no further input, and the micro-batch itself is bounded by the
sources' admission control (`MILLSTREAM_MAX_RECORDS_PER_BATCH`), so the backlog per shard stays
below the limit plus one batch's productions. Nothing is lost: the micro-batch waits, unprocessed.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from millstream.connectors.delivery import deliver_all
from millstream.connectors.plan import BatchPlan
from millstream.connectors.topology import ComputationSpec
from millstream.errors import ConfigurationError, FencedError, MillstreamError
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardStore
from millstream.state.watermarks import NONE_KNOWN, now_ms

if TYPE_CHECKING:
    from millstream.connectors.driver import ComputationRunner

log = logging.getLogger(__name__)
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 5.0
LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class DrainResult:
    """What one delivery-only shard task did: productions delivered, left, and the last error."""

    shard: int
    delivered: int
    pending: int
    error: str | None = None
    streams: tuple[str, ...] = ()  # streams of the productions that were pending


def pending_counts(client: Any, keys: list[ShardKeys]) -> list[int]:
    """Checkpointed, unacknowledged productions per shard: one round trip."""
    pipe = client.pipeline(transaction=False)
    for shard_keys in keys:
        pipe.hlen(shard_keys.productions)
    return [int(n) for n in pipe.execute()]


def drain_shard(
    plan: BatchPlan, spec: ComputationSpec, shard: int, only: frozenset[str] | None = None
) -> DrainResult:
    """Executor side: take the shard's lease, re-deliver its checkpoints, acknowledge them.

    Runs no user code and fires no timers, so it adds no productions. A failed delivery leaves
    the checkpoints where they are; a newer owner (FencedError) delivers them itself.
    `only` (the fused runtime): only checkpoints of these streams, bound only outside the
    application; the others wait to be handed to their consumers in the next batch.
    """
    keys = ShardKeys(plan.app, spec.name, shard)
    store = ShardStore(connect(plan.redis_url), keys, plan.shard_config)
    store.acquire()
    pending = store.pending_productions()
    if only is not None:
        pending = [p for p in pending if p.stream in only]
    if not pending:
        return DrainResult(shard, 0, 0)
    streams = tuple(sorted({p.stream for p in pending}))
    try:
        delivered = deliver_all(plan, spec.name, shard, pending)
    except ConfigurationError:
        raise
    except (MillstreamError, KafkaException) as exc:
        return DrainResult(shard, 0, len(pending), f"{type(exc).__name__}: {exc}", streams)
    ack = store.begin()
    ack.ack(delivered)
    ack.count("delivered", len(delivered))
    ack.count("redelivered", len(delivered))
    try:
        store.commit(ack)
    except FencedError as exc:
        return DrainResult(shard, 0, len(pending), f"FencedError: {exc}", streams)
    return DrainResult(shard, len(delivered), len(pending) - len(delivered), None, streams)


def _drain_task(plan: BatchPlan, spec: ComputationSpec, shards: Iterator[int]) -> Iterator[Any]:
    for shard in shards:
        yield drain_shard(plan, spec, shard)


def _delivery_plan(runner: ComputationRunner, batch_id: int) -> BatchPlan:
    """The batch plan delivery-only tasks need: no input, so no input watermark."""
    return runner.batch_plan(batch_id, NONE_KNOWN)


def targets_of(deliveries: Mapping[str, Sequence[Any]], streams: set[str]) -> str:
    """Human-readable targets of these output streams, for the log."""
    names = []
    for stream, targets in sorted(deliveries.items()):
        if stream not in streams:
            continue
        for target in targets:
            sink = getattr(target.factory, "sink", None)
            topic = getattr(target.factory, "topic", None)
            what = type(sink).__name__ if sink is not None else f"topic {topic}"
            names.append(f"{stream} -> {what}")
    return ", ".join(names) or "(none)"


def hold_while_backlogged(runner: ComputationRunner, spark: Any, batch_id: int) -> float:
    """Driver side, before a micro-batch: wait until every shard is under the limit.

    Returns the seconds spent waiting. Raises MillstreamError when the query is stopped while
    waiting, so Spark does not record the unprocessed micro-batch as done.
    """
    limit = runner.settings.max_pending_productions
    keys = [ShardKeys(runner.topology.app, runner.spec.name, s) for s in range(runner.shards)]
    counts = pending_counts(runner.client, keys)
    if max(counts, default=0) <= limit:
        return 0.0
    name = runner.spec.name
    started = time.monotonic()
    pause = FIRST_PAUSE_S
    last_log = 0.0
    rounds = 0
    last_error: str | None = None
    while max(counts) > limit:
        if runner.query is not None and not runner.query.isActive:
            raise MillstreamError(
                f"computation {name!r} was stopped while waiting for its targets; micro-batch "
                f"{batch_id} stays unprocessed and runs on restart"
            )
        plan = _delivery_plan(runner, batch_id)
        backlogged = [s for s, n in enumerate(counts) if n > 0]
        results: list[DrainResult]
        if runner.driver_delivery is not None:
            # The driver delivers this computation's productions: drain with its producers.
            # A drain task in an executor would start a second transactional producer per
            # shard, racing the driver's (seen: a commit in doubt resumed after the drain had
            # re-delivered the same productions: doubles).
            results = [drain_shard(plan, runner.spec, s) for s in backlogged]
        else:
            results = (
                spark.sparkContext.parallelize(backlogged, len(backlogged))
                .mapPartitions(functools.partial(_drain_task, plan, runner.spec))
                .collect()
            )
        rounds += 1
        last_error = next((r.error for r in results if r.error), last_error)
        counts = pending_counts(runner.client, keys)
        if max(counts) <= limit:
            break
        if time.monotonic() - last_log >= LOG_EVERY_S:
            last_log = time.monotonic()
            worst = max(range(len(counts)), key=counts.__getitem__)
            log.warning(
                "computation %s is waiting on target(s) %s: %d productions pending on shard %d "
                "(%d in all; MILLSTREAM_MAX_PENDING_PRODUCTIONS=%d); not taking new input for "
                "%.0fs%s",
                name,
                targets_of(
                    runner.deliveries,
                    {s for r in results if r.error for s in r.streams}
                    or {s for r in results for s in r.streams},
                ),
                counts[worst],
                worst,
                sum(counts),
                limit,
                time.monotonic() - started,
                f"; last error: {last_error}" if last_error else "",
            )
            runner.client.hset(
                runner.metrics_key,
                "backpressure",
                json.dumps(
                    {
                        "since": now_ms() - int((time.monotonic() - started) * 1000),
                        "pending": counts,
                    }
                ),
            )
        time.sleep(pause)
        pause = min(MAX_PAUSE_S, pause * 2)
    waited = time.monotonic() - started
    pipe = runner.client.pipeline(transaction=False)
    pipe.hincrby(runner.metrics_key, "backpressure_waits", 1)
    pipe.hincrbyfloat(runner.metrics_key, "backpressure_seconds", round(waited, 3))
    pipe.hdel(runner.metrics_key, "backpressure")
    pipe.execute()
    log.warning(
        "computation %s: targets accept productions again after %.1fs (%d delivery rounds); "
        "taking new input",
        name,
        waited,
        rounds,
    )
    return waited
