"""A join run by `millstream run` (`tests.e2e.join_target:topology`, for tests/e2e/test_join.py).

Clicks `{"click_id", "query_id"}` on JOIN_TARGET_CLICKS, queries `{"query_id", "text"}` on
JOIN_TARGET_QUERIES (record ids in the `id` header); registry JOIN_TARGET_REGISTRY; waiting
clicks per shard bounded by JOIN_TARGET_MAX_WAITING (default: the join's default); the
registry at JOIN_TARGET_REGISTRY_URL (default REDIS_URL); queries kept in the cache
JOIN_TARGET_CACHE_TTL_S seconds (default the join's). A click may carry its query's time
(`query_ts`, ms): the log tier searches around it, else around the click's time.
"""

from __future__ import annotations

import json
import os
from typing import Any

from millstream import JoinRetry, Record, Topology, json_field, kafka_source

RETRY = JoinRetry(first_ms=200, max_ms=1_000, give_up_ms=6_000)


def combine(click: Any, query: bytes) -> dict[str, Any]:
    body, q = json.loads(click.value), json.loads(query)
    return {"click": body["click_id"], "query": q["query_id"], "text": q["text"]}


def query_time(click: Record) -> int:
    """Photon encodes the query's time in its id; here a click may say it (`query_ts`)."""
    return int(json.loads(click.value).get("query_ts", click.timestamp))


def build(
    app: str, clicks: str, queries: str, registry: str, max_waiting: int, registry_url: str | None,
    cache_ttl_s: int = 3600,
) -> Topology:  # fmt: skip
    topology = Topology(app)
    topology.source("clicks", kafka_source(clicks, id_header="id"), max_out_of_order_ms=1_000)
    topology.source("queries", kafka_source(queries, id_header="id"), max_out_of_order_ms=1_000)
    topology.join(
        "joiner", primary="clicks", primary_id=json_field("click_id"), secondary="queries",
        secondary_id=json_field("query_id"), lookup=json_field("query_id"), combine=combine,
        output="joined", registry=registry, retry=RETRY, shards=2, max_waiting=max_waiting,
        registry_url=registry_url, cache_ttl_s=cache_ttl_s, lookup_time=query_time,
    )  # fmt: skip
    return topology


def topology() -> Topology:
    env = os.environ
    return build(
        env["MILLSTREAM_APP"],
        env["JOIN_TARGET_CLICKS"],
        env["JOIN_TARGET_QUERIES"],
        env["JOIN_TARGET_REGISTRY"],
        int(env.get("JOIN_TARGET_MAX_WAITING", "10000")),
        env.get("JOIN_TARGET_REGISTRY_URL") or None,
        int(env.get("JOIN_TARGET_CACHE_TTL_S", "3600")),
    )
