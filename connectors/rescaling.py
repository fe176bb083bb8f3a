"""The driver's side of rescaling: a computation's shard layout, and its moves between batches.

At start every stage takes its recorded layout (`state/shard_count.py`). Before each batch the
driver looks for `millstream rescale` requests for its computations (one HGETALL) and applies
each with `state/rescale.py`, while no shard task of this query runs: the batch after it routes
by the new count and its tasks work on the new shards. A move that must wait (the old shards
still hold productions to deliver) is tried again before the next batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from millstream.connectors.stage_plan import Stage
from millstream.fault_points import fault_point
from millstream.state.client import RedisClient
from millstream.state.rescale import MoveWaits, clean_retired, move
from millstream.state.shard_count import (
    ShardLayout,
    pending_rescales,
    record_layout,
    rescale_reports_key,
    rescale_requests_key,
)

log = logging.getLogger(__name__)


def take_layouts(client: RedisClient, app: str, stages: Mapping[str, Stage]) -> None:
    """Each stage runs with its computation's recorded layout (recorded now on a first start);
    keys a finished rescale left behind are deleted."""
    for stage in stages.values():
        layout = record_layout(client, app, stage.name, stage.shards)
        stage.shards, stage.generation = layout.shards, layout.generation
        clean_retired(client, app, stage.name)


def apply_rescales(client: RedisClient, app: str, stages: Mapping[str, Stage]) -> list[str]:
    """Apply the pending rescale requests for these stages; returns the computations moved."""
    requests = {c: n for c, n in pending_rescales(client, app).items() if c in stages}
    moved = []
    for name, shards in requests.items():
        stage = stages[name]
        current = ShardLayout(stage.shards, stage.generation)
        refusal = _refusal(stage, shards)
        if refusal is not None:
            log.error("rescale of %s refused: %s", name, refusal)
            _report(client, app, name, {"error": refusal, "old": current.encode()})
            client.hdel(rescale_requests_key(app), name)
            continue
        try:
            new = move(client, app, name, current, shards, fault_point)
        except MoveWaits as exc:
            log.warning("rescale of %s to %d shards waits: %s", name, shards, exc)
            continue
        stage.shards, stage.generation = new.shards, new.generation
        moved.append(name)
    return moved


def _refusal(stage: Stage, shards: int) -> str | None:
    if shards == stage.shards:
        return f"it already runs with {shards} shards"
    return None


def _report(client: RedisClient, app: str, name: str, report: dict[str, str]) -> None:
    client.hset(rescale_reports_key(app), name, json.dumps(report, sort_keys=True))
