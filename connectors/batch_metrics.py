"""What a batch leaves in Redis for `millstream status`, metrics and the bench: each
computation's counters (summed into its metrics hash) and last batch, and the query's phases."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from millstream.connectors.shard_task import ShardResult
from millstream.connectors.stage_plan import Stage
from millstream.state.client import RedisClient
from millstream.state.watermarks import INFINITY, Watermark, now_ms, percentile_watermark
from millstream.status import record_batch_seconds

log = logging.getLogger(__name__)


def stage_metrics(
    batch_id: int,
    input_wm: Watermark,
    published: Watermark,
    oldest: list[Watermark],
    results: list[ShardResult],
    busy: list[int],
) -> dict[str, Any]:
    """What the computation's metrics hash shows of this batch; counters under "counters"."""
    totals: dict[str, int] = {}
    for result in results:
        for name, amount in result.counters.items():
            totals[name] = totals.get(name, 0) + amount
    pending = [w.event for w in oldest if w.event < INFINITY]
    p99 = min(input_wm.event, percentile_watermark(pending, 0.99)) if pending else input_wm.event
    return {
        "batch_id": batch_id,
        "input_watermark": input_wm.event,
        "low_watermark": published.event,
        "p99_watermark": p99,
        "shard_tasks": len(busy),
        "round_trips": sum(r.round_trips for r in results),
        "fenced_retries": sum(r.fenced_retries for r in results),
        "shard_task_max": round(max((r.seconds for r in results), default=0.0), 4),
        "counters": totals,
    }


def record_batch(
    client: RedisClient,
    stages: Mapping[str, Stage],
    delivery: dict[str, dict[str, int]],
    query_key: str,
    last_batch: dict[str, Any],
    seconds: float,
) -> None:
    """Per computation: counters summed into its metrics hash, and the batch's figures as its
    last_batch; the batch's phases (`last_batch`) under the query's own key."""
    pipe = client.pipeline(transaction=False)
    for stage in stages.values():
        info = dict(stage.last_batch)
        counters = dict(info.pop("counters", {}))
        for name, amount in delivery.get(stage.name, {}).items():
            counters[name] = counters.get(name, 0) + amount
        for name, amount in counters.items():
            pipe.hincrby(stage.metrics_key, name, amount)
        pipe.hincrby(stage.metrics_key, "batches", 1)
        record_batch_seconds(pipe, stage.metrics_key, seconds)
        last = {**info, "seconds": round(seconds, 4), **counters}
        pipe.hset(
            stage.metrics_key, mapping={"last_batch": json.dumps(last), "updated_at": now_ms()}
        )
    pipe.hset(query_key, mapping={"last_batch": json.dumps(last_batch), "updated_at": now_ms()})
    pipe.execute()
    log.debug("batch %s", last_batch)
