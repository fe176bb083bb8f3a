"""`millstream status` counts from the shards' committed counters, not the driver's tally."""

from __future__ import annotations

from typing import Any

from millstream.state.keys import ShardKeys, app_key
from millstream.status import committed_counters, status


def test_status_counts_what_the_shards_committed(redis_client: Any, redis_namespace: str) -> None:
    app, name = redis_namespace, "relay"
    # The driver's tally missed the last batch (a crash between the shards' commits and the
    # driver's update); the shards committed their counters with their effects.
    redis_client.hset(app_key(app, "metrics", name), mapping={"records": 5, "batches": 2})
    for shard, (records, late) in enumerate([(4, 1), (3, 0)]):
        keys = ShardKeys(app, name, shard)
        redis_client.set(keys.sequencer, 1)
        redis_client.hset(keys.counters, mapping={"records": records, "late": late})

    assert committed_counters(redis_client, app, name) == {"records": 7, "late": 1}
    shown = status(redis_client, app)["computations"][name]
    assert (shown["records"], shown["late_records"], shown["batches"]) == (7, 1, 2)
    assert shown["shards"] == 2
