"""The demo's pipeline process: `python -m millstream.demo.worker CONFIG.json`.

Runs in its own process group so the demo can SIGKILL it (driver, JVM and Python workers) as a
machine crash would, then start it again from the same Spark checkpoints and Redis state.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from millstream import Topology, kafka_source, logfile_source, run
from millstream.demo.pipeline import build
from millstream.settings import Settings


def topology_from(config: dict[str, Any]) -> Topology:
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    # The sinks' clients get the MILLSTREAM_KAFKA_* pass-through (SASL, TLS) like every other.
    kafka = {**Settings.from_env().kafka_extra, "bootstrap.servers": str(config["bootstrap"])}
    sources = {
        "dc1": kafka_source(str(config["input_topic"]), name="dc1", id_header="event-id"),
        "dc2": logfile_source(
            str(config["log_dir"]),
            name="dc2",
            pattern="dc2*.log",
            keyField="q",
            timestampField="ts",
            idField="id",
            finishedAfterMs="2000",
            tailWatermark="clock",  # a fully read live file: the clock minus the slack
            watermarkSlackMs="1500",
        ),
    }
    sinks = {
        "window_counts": KafkaTransactionalSink(kafka, str(config["window_topic"])),
        "anomalies": KafkaTransactionalSink(kafka, str(config["anomaly_topic"])),
    }
    topology = build(str(config["app"]), sources, sinks, int(config["shards"]))
    topology.out_of_order_ms["queries"] = int(config["max_out_of_order_ms"])
    return topology


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[1]).read_text())
    run(topology_from(config), Settings.from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
