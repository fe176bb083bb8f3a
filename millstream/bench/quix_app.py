"""The Quix Streams side of `millstream bench`: the same 1-second tumbling count, exactly-once.

Run by the benchmark's own Quix virtualenv (Quix Streams 3.28.1 is not a millstream
dependency): `quix-venv/bin/python quix_app.py CONFIG.json`. CONFIG holds `bootstrap`,
`input_topic`, `output_topic`, `group`, `state_dir`, `commit_interval` and `progress_file`.

Set up for the embedded Tansu broker (INFRA.md): topics are declared with explicit retention
settings, windows close per partition (`closing_strategy="partition"`, so a key's window closes
as soon as a later record reaches its partition, as millstream's watermark timers do), and the
consumer group has short session timeouts. The number of processed messages is written to
`progress_file` (`{"processed": n, "t": unix seconds}`) five times a second.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

RETENTION = {"retention.ms": str(7 * 24 * 3600 * 1000), "retention.bytes": "-1"}


def _write_progress(path: Path, processed: list[int], halt: threading.Event) -> None:
    tmp = path.with_suffix(".tmp")
    while not halt.wait(0.2):
        tmp.write_text(json.dumps({"processed": processed[0], "t": time.time()}))
        os.replace(tmp, path)


def main(config_path: str) -> int:
    from quixstreams import Application
    from quixstreams.models.topics import TopicConfig

    config: dict[str, Any] = json.loads(Path(config_path).read_text())
    processed = [0]

    def on_processed(topic: str, partition: int, offset: int) -> None:
        processed[0] += 1

    app = Application(
        broker_address=config["bootstrap"],
        consumer_group=config["group"],
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=float(config["commit_interval"]),
        state_dir=config["state_dir"],
        consumer_extra_config={
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "fetch.wait.max.ms": 10,
        },
        producer_extra_config={"linger.ms": 5},
        on_message_processed=on_processed,
        loglevel="WARNING",
    )
    topic_config = TopicConfig(num_partitions=4, replication_factor=1, extra_config=RETENTION)
    source = app.topic(
        config["input_topic"],
        value_deserializer="json",
        key_deserializer="str",
        config=topic_config,
    )
    sink = app.topic(
        config["output_topic"], value_serializer="json", key_serializer="str", config=topic_config
    )
    sdf = app.dataframe(source)
    sdf = sdf.tumbling_window(duration_ms=1000).count().final(closing_strategy="partition")
    sdf = sdf.apply(
        lambda value, key, timestamp, headers: {"q": key, "w": value["start"], "n": value["value"]},
        metadata=True,
    )
    sdf.to_topic(sink)

    halt = threading.Event()
    writer = threading.Thread(
        target=_write_progress,
        args=(Path(config["progress_file"]), processed, halt),
        daemon=True,
    )
    writer.start()
    try:
        app.run()
    finally:
        halt.set()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
