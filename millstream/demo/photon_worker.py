"""One pipeline of the Photon demo: `python -m millstream.demo.photon_worker CONFIG.json APP`.

Two of these run active-active (each its own MILLSTREAM_APP and checkpoints) against one
IdRegistry; each process runs in its own session so the demo can SIGKILL or SIGSTOP it whole.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from millstream import JoinRetry, Record, Topology, json_field, kafka_source, run
from millstream.settings import Settings


def combine(click: Record, query: bytes) -> dict[str, Any]:
    """The joined event: the click with the query that showed its ad."""
    body, shown = json.loads(click.value), json.loads(query)
    return {"click": body["click_id"], "query": shown["query_id"], "terms": shown["terms"],
            "ad": body["ad"], "click_ms": click.timestamp}  # fmt: skip


def topology_from(config: dict[str, Any], app: str) -> Topology:
    topology = Topology(app)
    out_of_order = int(config["max_out_of_order_ms"])
    topology.source(
        "clicks", kafka_source(str(config["clicks_topic"]), id_header="event-id"),
        max_out_of_order_ms=out_of_order,
    )  # fmt: skip
    topology.source(
        "queries", kafka_source(str(config["queries_topic"]), id_header="event-id"),
        max_out_of_order_ms=out_of_order,
    )  # fmt: skip
    topology.join(
        "joiner",
        primary="clicks", primary_id=json_field("click_id"),
        secondary="queries", secondary_id=json_field("query_id"),
        lookup=json_field("query_id"), combine=combine, output="joined",
        registry=str(config["registry"]),
        retry=JoinRetry(first_ms=250, max_ms=2_000, give_up_ms=int(config["give_up_ms"])),
        shards=int(config["shards"]),
    )  # fmt: skip
    return topology


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[1]).read_text())
    run(topology_from(config, argv[2]), Settings.from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
