"""kill -9 of a whole pipeline between its Redis commit and its Kafka commit, then a restart.

The pipeline (`tests/e2e/sink_target.py`: source topic -> `relay`, one production per input ->
an external Kafka sink) runs as `millstream run` in its own session. A test-only crash point
(`MILLSTREAM_TEST_CRASH_AT`, `millstream/testing/_crash.py`) SIGKILLs every process of it (driver,
JVM, Python workers) the third time a delivery reaches that step:

- `after_redis_commit`: productions checkpointed in Redis, nothing sent to Kafka;
- `before_kafka_commit`: records produced and acknowledged inside an open Kafka transaction;
- `after_kafka_commit`: the transaction committed (or, at-least-once, the records acknowledged),
  the Redis checkpoints not yet acknowledged.

The transactional run goes through the three points in turn, each restart arming the next
(each crash checked as it happens: the point's mark, every process gone, checkpoints stranded);
the idempotent run crashes after the Kafka acknowledgement. Restarted at last without a crash
point, from the same Spark checkpoints and Redis state, every input's production must appear
exactly once, with per-key running counts 1..n (ground truth from what the test sent): in the
marker-aware read_committed view for the transactional sink, and through `DedupReader` for the
idempotent one. A plain read_committed consumer is checked too; on a broker that serves aborted
transactional data (Tansu) its wrong view is an expected failure naming the defect.

Productions that come out twice fail the test, except on the broker's own contradiction
(`sink_faults.unapplied_progress_evidence`, from progress offsets sampled every 50 ms through
the run): a transaction whose records the broker marked COMMIT while its coordinator kept
answering the progress from before it, so the restarted sink delivered them again (Tansu, 1 of
the last 4 CI runs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.sink_faults import (
    JOURNAL,
    UNAPPLIED_PROGRESS_REASON,
    Feeder,
    Phases,
    ProgressWatcher,
    _raw_partitions,
    assert_exactly_once,
    check_plain_consumer,
    metric,
    pending_productions,
    pipeline_env,
    read_output,
    start_pipeline,
    states,
    unapplied_progress_evidence,
    wait_complete,
)

pytestmark = pytest.mark.spark

CRASH_ON = 3  # the third delivery reaching the point: after a few clean ones
FIRST_WAVE = 60
TOTAL = 200


# One run per sink: the transactional one crashes at each point in turn (restarted with the next
# point armed), so every crash is checked where it happens and the final output for all three.
RUNS = {
    "transactional": ("after_redis_commit", "before_kafka_commit", "after_kafka_commit"),
    "idempotent": ("after_kafka_commit",),
}
WAVE = 20


@pytest.mark.parametrize("mode", sorted(RUNS))
def test_kill9_between_redis_commit_and_kafka_commit(
    mode: str,
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    source = kafka_topic_factory(partitions=2)
    sink = kafka_topic_factory(partitions=2)
    feeder = Feeder(kafka_bootstrap, source)
    base = pipeline_env(
        redis_url,
        kafka_bootstrap,
        app,
        tmp_path,
        SINK_TARGET_INPUT=source,
        SINK_TARGET_OUTPUT=sink,
        SINK_TARGET_MODE=mode,
        SINK_TARGET_TIMEOUT_S="20",
    )
    points = RUNS[mode]
    total = FIRST_WAVE + len(points) * (TOTAL - FIRST_WAVE)

    phase = Phases()
    feeder.send(feeder.events(0, FIRST_WAVE))
    sent = FIRST_WAVE
    stranded: list[Any] = []
    pipeline = None
    # The broker's answers about the sink's progress, sampled throughout: evidence, should
    # productions come out twice, of which side broke the transaction's atomicity.
    watcher = ProgressWatcher(kafka_bootstrap, app).start() if mode == "transactional" else None
    try:
        for point in points:
            crash_file = tmp_path / f"crash-points-{point}"
            crashing = {
                **base,
                "MILLSTREAM_TEST_CRASH_AT": f"{point}:{CRASH_ON}",
                "MILLSTREAM_TEST_CRASH_FILE": str(crash_file),
            }
            if pipeline is None:
                pipeline = start_pipeline(crashing, tmp_path)
            else:
                pipeline.start(crashing)
            # More input in small waves, so that later batches deliver too, until the crash
            # point kills the pipeline.
            batches = metric(redis_client, app, "batches")
            deadline = time.monotonic() + 240
            while pipeline.alive():
                assert time.monotonic() < deadline, f"no crash at {point}:\n{pipeline.log_tail()}"
                if sent < total and metric(redis_client, app, "batches") > batches:
                    feeder.send(feeder.events(sent, WAVE))
                    sent += WAVE
                time.sleep(1.0)
            phase(f"crashed at {point} after {sent} inputs sent")
            assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
            assert pipeline.members() == [], "a process of the pipeline survived the crash"
            hits = crash_file.read_text().splitlines()
            assert hits[-1] == f"CRASH {point} {CRASH_ON}", hits
            # The crash came between the Redis commit and the Redis acknowledgement of delivery.
            left_behind = pending_productions(redis_client, app)
            assert left_behind, f"the crash at {point} left no checkpointed productions behind"
            stranded.extend(left_behind)

        feeder.send(feeder.events(sent, total - sent))
        truth = feeder.finish()
        assert pipeline is not None
        pipeline.start(base)  # no crash point this time
        wait_complete(pipeline, kafka_bootstrap, sink, mode, truth)
        phase("restarted and delivered everything")
        settled = metric(redis_client, app, "batches") + 3
        pipeline.wait_for(
            lambda: metric(redis_client, app, "batches") >= settled, 60, "three more batches"
        )
        output = read_output(kafka_bootstrap, sink, mode)
        left = pending_productions(redis_client, app)
        final_states = states(redis_client, app)
        phase("three more batches")
    finally:
        if pipeline is not None:
            pipeline.stop(30)
        if watcher is not None:
            watcher.stop()
        phase("stopped")

    try:
        assert_exactly_once(output, truth, (kafka_bootstrap, sink))
    except AssertionError:
        doubled = sorted(e for e, n in output.ids.items() if n > 1)
        if watcher is None or set(output.ids) != set(truth):
            raise  # missing or unexpected productions: never the broker's by this rule
        evidence = unapplied_progress_evidence(
            doubled,
            tmp_path / JOURNAL,
            list(_raw_partitions(kafka_bootstrap, sink)),
            watcher.timeline(),
        )
        if evidence is None:
            raise
        pytest.xfail(f"{UNAPPLIED_PROGRESS_REASON}: {evidence}")
    # The checkpoints each crash stranded were delivered as they were checkpointed, under the
    # same ids, not recomputed (a later crash may strand one an earlier crash left: same id).
    for production in stranded:
        event = json.loads(production.value)["e"]
        assert output.production_ids[event] == production.id, event
    assert left == [], f"{len(left)} checkpoints never acknowledged"
    keys: dict[str, int] = {}
    for event in truth.values():
        keys[event.key] = keys.get(event.key, 0) + 1
    assert final_states == keys
    if mode == "idempotent":
        # At-least-once: the crashed delivery was re-sent after the restart, so the raw topic
        # holds duplicates that only the reader's dedup removes.
        assert output.raw > len(truth), "the crash after the Kafka ack duplicated nothing"
    else:
        assert output.raw == len(truth)
        check_plain_consumer(kafka_bootstrap, sink, truth)
