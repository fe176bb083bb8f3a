"""Log files as operations teams run them, at the injector's default options.

A writer appends JSON lines to `app.log` at 200 lines/s for 20 s and rotates it every 4 s the
two ways logrotate does: by rename (the writer goes on appending to the renamed file for a few
more lines before it reopens `app.log`) and once by copytruncate (the file copied to a name the
pattern matches, then truncated in place while the writer keeps appending). The pipeline
(`tests/e2e/logfile_target.py`: a per-key counter, a 1 s tumbling window count and a collector of
window results) is SIGKILLed 5 s in and started again at once. Against ground truth the writer
records: every line applied exactly once, every window of the run produced once with its exact
count, nothing late or dead-lettered, and the last window closed within a few seconds of the
writer stopping (counted from when the pipeline had caught up, if that was later: the restart's
catch-up is not what is measured).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from millstream.status import committed_counters, status
from millstream.testing.process import PipelineProcess
from tests.e2e.conftest import shard_states
from tests.e2e.logfile_target import SHARDS, WINDOW
from tests.e2e.sink_faults import ROOT, Phases, pipeline_env

pytestmark = pytest.mark.spark

RATE = 200  # lines per second
SECONDS = 20.0
ROTATE_EVERY_S = 4.0
COPYTRUNCATE_AT = 2  # the second rotation copies and truncates; the others rename
KEYS = 8
CLOSE_WITHIN_S = 10.0  # the idle slack (2 s), the 1 s window and batches, with margin


class LogWriter(threading.Thread):
    """Writes the lines and rotates; `lines` is the ground truth: (id, key, event time)."""

    def __init__(self, directory: Path, seed: int) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.rng = random.Random(seed)
        self.lines: list[tuple[str, str, int]] = []
        self.rotations: list[str] = []
        self.stopped_at = 0.0
        self.error: BaseException | None = None

    def _write(self, fh: Any, n: int) -> None:
        for _ in range(n):
            now = int(time.time() * 1000)
            line = (f"e{len(self.lines)}", f"k{self.rng.randrange(KEYS)}", now)
            fh.write(json.dumps({"e": line[0], "key": line[1], "ts": line[2]}).encode() + b"\n")
            self.lines.append(line)
        fh.flush()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _run(self) -> None:
        path = self.directory / "app.log"
        fh = open(path, "ab")  # noqa: SIM115 - O_APPEND, as loggers open their files
        started = time.monotonic()
        next_rotation = started + ROTATE_EVERY_S
        while (now := time.monotonic()) < started + SECONDS:
            self._write(fh, RATE // 20)
            if now >= next_rotation:
                next_rotation += ROTATE_EVERY_S
                n = len(self.rotations) + 1
                if n == COPYTRUNCATE_AT:
                    shutil.copyfile(path, self.directory / f"app-copy-{n}.log")
                    os.truncate(path, 0)  # the writer keeps its descriptor
                    self.rotations.append("copytruncate")
                else:
                    os.rename(path, self.directory / f"app.log.{n}")
                    time.sleep(0.05)
                    self._write(fh, 5)  # still writing to the renamed file for a moment
                    fh.close()
                    fh = open(path, "ab")  # noqa: SIM115
                    self.rotations.append("rename")
            time.sleep(0.05)
        fh.close()
        self.stopped_at = time.monotonic()


def test_rotations_both_ways_and_a_sigkill_at_default_options(
    redis_url: str,
    redis_client: Any,
    redis_namespace: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    app = redis_namespace
    logs = tmp_path / "logs"
    logs.mkdir()
    env = pipeline_env(redis_url, kafka_bootstrap, app, tmp_path, LOGFILE_TARGET_DIR=str(logs))
    del env["MILLSTREAM_TRIGGER_MS"]  # default options throughout
    pipeline = PipelineProcess.run_target(
        "tests.e2e.logfile_target:topology", env, tmp_path / "pipeline.log", cwd=ROOT
    )
    writer = LogWriter(logs, seed=2701)
    phase = Phases()

    def applied() -> int:
        return sum(shard_states(redis_client, app, "counter", SHARDS).values())

    def windows() -> dict[str, dict[str, int]]:
        states = shard_states(redis_client, app, "collector", SHARDS)
        return {key: state["windows"] for key, state in states.items()}

    with open(logs / "app.log", "ab") as first:
        writer._write(first, 1)  # a first line, for the pipeline to show it is up
    pipeline.start()
    try:
        pipeline.wait_for(lambda: applied() > 0, 120, "the first line applied")
        writer.start()
        phase("pipeline up, the writer started")
        time.sleep(5.0)
        pipeline.kill9()
        assert pipeline.wait_exit(10) == -9, pipeline.log_tail()
        phase(f"SIGKILLed at {applied()} lines applied of {len(writer.lines)} written")
        pipeline.start()
        writer.join(SECONDS + 10)
        assert writer.error is None, writer.error
        assert writer.rotations.count("copytruncate") == 1 and "rename" in writer.rotations
        phase(f"writer stopped after {len(writer.lines)} lines, rotations {writer.rotations}")

        truth = Counter(key for _, key, _ in writer.lines)
        want: dict[str, dict[str, int]] = {}
        for _, key, ts in writer.lines:
            start = ts - ts % WINDOW.size_ms
            name = f"windows|{start}|{start + WINDOW.size_ms}"
            want.setdefault(key, {})[name] = want.setdefault(key, {}).get(name, 0) + 1
        expected = sum(len(w) for w in want.values())
        try:
            pipeline.wait_for(
                lambda: applied() >= len(writer.lines), 120, f"{len(writer.lines)} lines applied"
            )
            # Caught up: from here (or from the writer's last line, if later) only the
            # watermark stands between the last windows and their results.
            caught_up = max(time.monotonic(), writer.stopped_at)
            pipeline.wait_for(
                lambda: sum(len(w) for w in windows().values()) >= expected,
                120,
                f"{expected} windows closed",
            )
        except AssertionError as exc:
            got = sum(len(w) for w in windows().values())
            counters = committed_counters(redis_client, app, "counter", SHARDS)
            raise AssertionError(
                f"{exc}\napplied {applied()}, windows {got}, counter's counters {counters}"
            ) from None
        done = time.monotonic()
        closed_after = done - caught_up
        phase(
            f"every line applied {caught_up - writer.stopped_at:.1f} s after the writer stopped, "
            f"every window closed {closed_after:.1f} s after that"
        )
        time.sleep(2.0)  # a (wrong) second delivery of a window would land by now
    finally:
        pipeline.stop(30)

    assert shard_states(redis_client, app, "counter", SHARDS) == dict(truth)
    collected = shard_states(redis_client, app, "collector", SHARDS)
    assert {key: state["windows"] for key, state in collected.items()} == want
    assert all(state["again"] == [] for state in collected.values()), "a window came twice"
    for computation in ("counter", "tumbling"):
        counters = committed_counters(redis_client, app, computation, SHARDS)
        assert counters.get("records") == len(writer.lines), (computation, counters)
        assert counters.get("late", 0) == 0 and counters.get("dead_letters", 0) == 0, counters
    # What rotation did is counted where an operator looks (`millstream status`).
    told = status(redis_client, app)["injectors"]["lines"]
    # A copytruncate seen while the pipeline runs is counted as one; a rotation that comes
    # while it is down (its restart is slow on a loaded machine) is found under the rotated
    # name instead (seen once in a trial at load 7, every line and window still exact).
    assert told.get("lost", 0) == 0, told
    assert told.get("copytruncated", 0) + told.get("rotated_unseen", 0) >= 1, told
    assert closed_after <= CLOSE_WITHIN_S, f"the last window closed {closed_after:.1f} s late"
