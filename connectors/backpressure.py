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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from millstream.connectors.delivery import RETRIED, deliver_all
from millstream.connectors.plan import BatchPlan
from millstream.connectors.topology import ComputationSpec
from millstream.errors import ConfigurationError, FencedError, MillstreamError
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardStore
from millstream.state.watermarks import now_ms

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
    keys = ShardKeys(plan.app, spec.name, shard, plan.generation)
    store = ShardStore(connect(plan.redis_url), keys, plan.shard_config)
    store.acquire()
    every = store.pending_productions()
    pending = every if only is None else [p for p in every if p.stream in only]
    if not pending:
        return DrainResult(shard, 0, 0)
    streams = tuple(sorted({p.stream for p in pending}))
    try:
        # The operator's say first, as in the settlement (a join's registry gate).
        outside, skipped, _ = spec.operator.before_delivery(plan, spec.name, shard, pending)
        delivered = deliver_all(plan, spec.name, shard, outside) + skipped
    except ConfigurationError:
        raise
    except RETRIED as exc:
        return DrainResult(shard, 0, len(pending), f"{type(exc).__name__}: {exc}", streams)
    ack = store.begin()
    ack.ack(delivered, every)
    ack.count("delivered", len(delivered))
    ack.count("redelivered", len(delivered))
    try:
        store.commit(ack)
    except FencedError as exc:
        return DrainResult(shard, 0, len(pending), f"FencedError: {exc}", streams)
    return DrainResult(shard, len(delivered), len(pending) - len(delivered), None, streams)


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


def hold_while_backlogged(
    stages: Sequence[Any],
    app: str,
    client: Any,
    limit: int,
    plan_of: Callable[[Any], BatchPlan],
    pool: Executor,
    still_running: Callable[[], bool],
    batch_id: int,
) -> None:
    """Before a batch: while a shard of a stage (`connectors.stage_plan.Stage`) holds more
    than `limit` checkpoints bound outside (its sink is down or slow), take no new input:
    re-deliver them from here (`plan_of(stage)`, shards in `pool`), with backoff, until every
    shard is under the limit. Checkpoints that consumers here still have to see wait for the
    batch's hand-over: they never block it (so a stream both consumed here and sunk outside
    gets no backpressure yet)."""
    for stage in stages:
        if not any(stage.targets.values()):
            continue
        keys = stage.keys(app)
        counts = pending_counts(client, keys)
        if max(counts, default=0) <= limit:
            continue
        # Streams bound only outside: one also consumed here is acknowledged only after its
        # hand-over, in a batch.
        outside = frozenset(s for s, t in stage.targets.items() if t and s not in stage.consumers)
        started, pause, last_log, error = time.monotonic(), FIRST_PAUSE_S, 0.0, None
        while True:
            if not still_running():
                raise MillstreamError(
                    f"application {app!r} was stopped while waiting for its targets; "
                    f"micro-batch {batch_id} stays unprocessed and runs on restart"
                )
            plan = plan_of(stage)
            over = [s for s, n in enumerate(counts) if n > limit]
            drain = functools.partial(drain_shard, plan, stage.spec, only=outside)
            drained = list(pool.map(drain, over))
            error = next((d.error for d in drained if d.error), error)
            counts = pending_counts(client, keys)
            if max(counts) <= limit or not any(d.pending for d in drained):
                break  # under the limit, or what is left waits for the hand-over
            if time.monotonic() - last_log >= LOG_EVERY_S:
                last_log = time.monotonic()
                log.warning(
                    "computation %s is waiting on target(s) %s: %d productions pending "
                    "(MILLSTREAM_MAX_PENDING_PRODUCTIONS=%d per shard); not taking new "
                    "input for %.0fs%s",
                    stage.name,
                    targets_of(stage.targets, {s for d in drained for s in d.streams}),
                    sum(counts),
                    limit,
                    time.monotonic() - started,
                    f"; last error: {error}" if error else "",
                )
                since = now_ms() - int((time.monotonic() - started) * 1000)
                client.hset(
                    stage.metrics_key,
                    "backpressure",
                    json.dumps({"since": since, "pending": counts}),
                )
            time.sleep(pause)
            pause = min(MAX_PAUSE_S, pause * 2)
        waited = time.monotonic() - started
        pipe = client.pipeline(transaction=False)
        pipe.hincrby(stage.metrics_key, "backpressure_waits", 1)
        pipe.hincrbyfloat(stage.metrics_key, "backpressure_seconds", round(waited, 3))
        pipe.hdel(stage.metrics_key, "backpressure")
        pipe.execute()
        log.warning(
            "computation %s: targets accept productions again after %.1fs; taking new input",
            stage.name,
            waited,
        )
