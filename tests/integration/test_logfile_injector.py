"""The log-file injector under real Spark, real files and real Redis.

Ground truth is computed independently of the injector: every complete line of every file in
the directory, by (st_dev, st_ino, byte offset), read straight from disk.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from millstream.injectors.logfile import SHORT_NAME, LogFileInjector
from millstream.state.client import connect
from millstream.state.watermarks import WatermarkAuthority

pytestmark = pytest.mark.spark

Row = dict[str, Any]


def line(key: str, ts: int) -> bytes:
    return json.dumps({"key": key, "ts": ts}).encode() + b"\n"


def append(path: Path, data: bytes, mtime_ms: int | None = None) -> None:
    with open(path, "ab") as fh:
        fh.write(data)
    if mtime_ms is not None:
        os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


def truth(directory: Path) -> dict[tuple[int, int, int], bytes]:
    """Every complete line on disk: (dev, ino, offset) -> line."""
    out = {}
    for name in os.listdir(directory):
        path = directory / name
        st = os.stat(path)
        data = path.read_bytes()
        pos = 0
        while (nl := data.find(b"\n", pos)) >= 0:
            out[(st.st_dev, st.st_ino, pos)] = data[pos:nl]
            pos = nl + 1
    return out


def position(row: Row) -> tuple[int, int, int]:
    dev, ino, _ = row["source"].split(":")
    return int(dev), int(ino), row["offset"]


def checkpoint_offsets(checkpoint: str) -> list[dict[str, Any]]:
    """The source offsets Spark logged, in batch order."""
    folder = Path(checkpoint) / "offsets"
    batches = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
    return [json.loads((folder / str(b)).read_text().splitlines()[2]) for b in batches]


class Runner:
    """Runs the source into a foreachBatch that collects rows on the driver."""

    def __init__(self, spark: Any, checkpoint: str) -> None:
        spark.dataSource.register(LogFileInjector)
        self.spark = spark
        self.checkpoint = checkpoint
        self.batches: list[tuple[int, list[Row]]] = []

    def _writer(self, options: dict[str, str]) -> Any:
        def capture(df: Any, batch_id: int) -> None:
            self.batches.append((batch_id, [r.asDict() for r in df.collect()]))

        frame = self.spark.readStream.format(SHORT_NAME).options(**options).load()
        return frame.writeStream.foreachBatch(capture).option("checkpointLocation", self.checkpoint)

    def available_now(self, options: dict[str, str]) -> list[Row]:
        """One run to the end of what exists now; returns the rows it delivered."""
        before = len(self.batches)
        query = self._writer(options).trigger(availableNow=True).start()
        try:
            assert query.awaitTermination(120), "availableNow run did not finish"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        return [r for _, rows in self.batches[before:] for r in rows]

    def tail(self, options: dict[str, str], steps: list[Callable[[], None]]) -> list[Row]:
        """A processing-time query; each step runs once the previous step's lines arrived."""
        before = len(self.batches)
        query = self._writer(options).trigger(processingTime="200 milliseconds").start()
        try:
            for step in steps:
                want = len(truth(Path(options["path"])))
                step()
                deadline = time.monotonic() + 60
                while len(self.delivered(before)) < want and time.monotonic() < deadline:
                    assert query.exception() is None, query.exception()
                    time.sleep(0.2)
            wanted = len(truth(Path(options["path"])))
            deadline = time.monotonic() + 60
            while len(self.delivered(before)) < wanted and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            query.stop()
        return self.delivered(before)

    def delivered(self, since: int) -> list[Row]:
        return [r for _, rows in self.batches[since:] for r in rows]


def assert_exactly(rows: list[Row], directory: Path) -> None:
    """Every complete line on disk delivered exactly once, byte-exact, with a unique id."""
    positions = [position(r) for r in rows]
    assert len(positions) == len(set(positions)), "a line was delivered twice"
    assert {position(r): r["value"] for r in rows} == truth(directory)
    assert len({r["id"] for r in rows}) == len(rows)


def test_rotation_partial_lines_errors_restart_and_replay(
    spark: Any, tmp_path: Path, tmp_checkpoint: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    t0 = 1_700_000_000_000
    head = [line("a", t0), b"{not json\n", line("b", t0 + 1), b'{"ts": 5}\n', line("c", t0 + 2)]
    partial = b'{"key": "d", "ts": '
    append(app, b"".join(head) + partial)  # the last line is held back until its newline
    bad_json, no_key = len(head[0]), sum(map(len, head[:3]))
    options = {
        "path": str(logs),
        "stream": "clicks",
        "maxRecordsPerTrigger": "2",  # several batches: admission control under AvailableNow
        "bytesPerPartition": "40",  # several tasks per file: split ranges, no line lost or doubled
    }
    run = Runner(spark, tmp_checkpoint)

    first = run.available_now(options)
    assert len(run.batches) >= 3
    good = [r for r in first if r["error"] is None]
    assert [r["key"] for r in good] == [b"a", b"b", b"c"]
    assert [r["timestamp"] for r in good] == [t0, t0 + 1, t0 + 2]
    errors = {r["offset"]: r for r in first if r["error"] is not None}
    assert sorted(errors) == [bad_json, no_key]
    assert errors[bad_json]["value"] == b"{not json" and "invalid JSON" in errors[bad_json]["error"]
    assert "missing key field 'key'" in errors[no_key]["error"]
    assert (
        str(app) in errors[no_key]["error"] and errors[no_key]["source"] in errors[no_key]["error"]
    )
    assert all(r["stream"] == "clicks" and r["partition"] == 0 for r in first)
    assert max(r["offset"] for r in first) < sum(map(len, head))  # not the partial line

    # The partial line completes; then logrotate renames app.log, the writer adds one last line
    # to the renamed file, and a new app.log starts.
    append(app, b"%d}\n" % (t0 + 3) + line("e", t0 + 4))
    os.rename(app, logs / "app.log.1")
    append(logs / "app.log.1", line("f", t0 + 5))
    append(app, line("g", t0 + 6) + line("h", t0 + 7))
    second = run.available_now(options)
    assert sorted(r["key"] for r in second) == [b"d", b"e", b"f", b"g", b"h"]
    assert_exactly(first + second, logs)

    # Replay: forget that the last batch committed (Spark re-runs only the newest batch). It
    # re-runs from its logged offsets, and the rows must be identical (ids, system_time and all).
    last_batch, last_rows = run.batches[-1]
    assert last_rows, "the last batch of an AvailableNow run delivers data"
    for name in (str(last_batch), f".{last_batch}.crc"):
        (Path(tmp_checkpoint) / "commits" / name).unlink()
    replay = run.available_now(options)
    assert sorted(replay, key=position) == sorted(last_rows, key=position)

    # Restart with nothing new: no line comes again.
    assert run.available_now(options) == []
    assert_exactly(first + second, logs)


def test_tailing_a_live_file(spark: Any, tmp_path: Path, tmp_checkpoint: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    now = int(time.time() * 1000)
    append(app, line("a", now))
    options = {"path": str(logs), "stream": "s", "tickMs": "100"}

    def partial() -> None:
        append(app, line("b", now) + b'{"key": "c", "ts"')

    def complete() -> None:
        append(app, b": %d}\n" % now)

    def rotate() -> None:
        os.rename(app, logs / "app.log.1")
        append(logs / "app.log.1", line("d", now))
        append(app, line("e", now))

    run = Runner(spark, tmp_checkpoint)

    def idle() -> None:
        time.sleep(1.5)  # nothing to read: only ticks advance the offset

    rows = run.tail(options, [partial, complete, rotate, idle])
    assert_exactly(rows, logs)
    assert sorted(r["key"] for r in rows) == [b"a", b"b", b"c", b"d", b"e"]
    assert any(not rows for _, rows in run.batches), "ticks run empty batches"
    system_times = [r["system_time"] for _, rows in run.batches for r in rows]
    assert system_times == sorted(system_times)


def test_watermark_is_published_monotonic_and_follows_the_rule(
    spark: Any, tmp_path: Path, tmp_checkpoint: str, redis_url: str, redis_namespace: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    now = int(time.time() * 1000)
    old, cur = now - 100_000, now - 50_000
    # creation estimate = min(mtime, first line's event time): here the mtimes we set
    append(logs / "old.log", line("o", old + 10), mtime_ms=old)
    append(logs / "cur.log", line("c", cur + 10), mtime_ms=cur)
    options = {
        "path": str(logs),
        "stream": "events",
        "finishedAfterMs": "1000",
        "watermarkSlackMs": "500",
        "tailWatermark": "creation",  # MillWheel's Figure 10 first; the default (clock) below
        "redis.url": redis_url,
        "app": redis_namespace,
        "instance": "host-1",
    }
    authority = WatermarkAuthority(connect(redis_url), redis_namespace)
    run = Runner(spark, tmp_checkpoint)

    run.available_now(options)
    # old.log is quiet and cur.log is newer: finished and read. cur.log is the newest: unfinished.
    assert checkpoint_offsets(tmp_checkpoint)[-1]["wm"][0] == cur
    assert authority.injector_stream("events").event == cur

    new = now - 10_000
    append(logs / "new.log", line("n", new + 10), mtime_ms=new)
    run.available_now(options)
    assert checkpoint_offsets(tmp_checkpoint)[-1]["wm"][0] == new
    assert authority.injector_stream("events").event == new

    # A log that never rotates: with tailWatermark=clock a file read to its end follows the
    # clock (quantised to the tick) minus the slack.
    run.available_now({**options, "tailWatermark": "clock", "tickMs": "1000"})
    last = checkpoint_offsets(tmp_checkpoint)[-1]
    assert last["wm"][0] == last["tick"] * 1000 - 500
    published = authority.injector_stream("events")
    assert (published.event, published.system) == tuple(last["wm"])

    marks = [tuple(o["wm"]) for o in checkpoint_offsets(tmp_checkpoint)]
    assert [m[0] for m in marks] == sorted(m[0] for m in marks)
    assert [m[1] for m in marks] == sorted(m[1] for m in marks)


def test_a_join_throttle_pauses_the_log_file_injector(
    tmp_path: Path, redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    """While the application's throttle flag names the stream, `latestOffset` plans no batch
    (it returns its start); cleared, the lines are planned. The flag is the one a join's driver
    writes (`state/throttle.py`)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from millstream.injectors.logfile import LogFileOptions, LogFileStreamReader
    from millstream.state.throttle import throttle_key

    logs = tmp_path / "logs"
    logs.mkdir()
    now = int(time.time() * 1000)
    append(logs / "clicks.log", line("k1", now) + line("k2", now + 1))
    options = {"path": str(logs), "stream": "clicks", "redis.url": redis_url,
               "app": redis_namespace, "throttle": "true"}  # fmt: skip
    reader = LogFileStreamReader(LogFileOptions.from_options(options))
    start = reader.initialOffset()
    redis_client.hset(throttle_key(redis_namespace), "clicks", json.dumps({"since": now}))
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # paused: no batch
    redis_client.hdel(throttle_key(redis_namespace), "clicks")
    planned = reader.latestOffset(start, ReadAllAvailable())
    assert planned != start
    batches = [b for part in reader.partitions(start, planned) for b in reader.read(part)]
    assert sum(batch.num_rows for batch in batches) == 2
    # Another stream's pause, or no throttle option: not paused.
    redis_client.hset(throttle_key(redis_namespace), "queries", "{}")
    unthrottled = LogFileStreamReader(LogFileOptions.from_options({**options, "throttle": "false"}))
    redis_client.hset(throttle_key(redis_namespace), "clicks", "{}")
    assert unthrottled.latestOffset(start, ReadAllAvailable()) != start
