"""Planning of the log-file injector over real files in a temporary directory (no Spark).

Covers identity across rotation, partial lines, inode reuse, vanished bytes, read limits,
the watermark rule and the offset round trip.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from functools import partial
from pathlib import Path

import pytest

from millstream.injectors._logfile_directory import rotated_name, scan_directory
from millstream.injectors._logfile_offset import Position
from millstream.injectors._logfile_parse import JsonLinesParser
from millstream.injectors._logfile_plan import (
    Budget,
    Planner,
    Rules,
    event_watermark,
    is_finished,
)
from millstream.injectors._logfile_read import FileSlice, LostSlice, SliceReader, slices
from millstream.injectors.logfile import first_line_timestamp, last_line_timestamp

T0 = 1_800_000_000_000  # a fixed "now" for plans
RULES = Rules(finished_after_ms=10_000, slack_ms=2_000, tick_ms=1_000, tail_clock=False)


def make_planner(directory: Path, rules: Rules = RULES) -> Planner:
    parser = JsonLinesParser()
    return Planner(
        str(directory),
        "*.log",
        rules,
        partial(first_line_timestamp, parser),
        partial(last_line_timestamp, parser),
    )


def line(key: str, ts: int) -> bytes:
    return json.dumps({"key": key, "ts": ts}).encode() + b"\n"


def write(path: Path, data: bytes, mtime_ms: int | None = None) -> None:
    with open(path, "ab") as fh:
        fh.write(data)
    if mtime_ms is not None:
        os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


def rows(directory: Path, start: Position, end: Position, chunk: int = 1 << 20) -> list[dict]:
    reader = SliceReader("s", str(directory), JsonLinesParser(), "jsonl", False)
    out = []
    for part in slices(start, end, chunk):
        for batch in reader.read(part):
            out.extend(batch.to_pylist())
    return out


def keys(result: list[dict]) -> list[bytes]:
    return [r["key"] for r in result]


# --- pure rules ----------------------------------------------------------------------------------
def test_finished_needs_quiet_time_and_a_newer_file() -> None:
    assert is_finished(
        mtime_ms=0, created=0, now=10_000, finished_after_ms=10_000, others_created=[5]
    )
    assert not is_finished(0, 0, 9_999, 10_000, [5])  # modified too recently
    assert not is_finished(0, 5, 10_000, 10_000, [5, 3])  # it is the newest file


def test_event_watermark_is_min_creation_of_unfinished_files() -> None:
    clock = 100_000
    now = clock + 2_000

    def wm(views: list[tuple[int, bool, bool]], tail: bool) -> int:
        return event_watermark([(*v, None) for v in views], clock, tail, now)

    # (created, unread, finished)
    assert wm([(10, False, True), (20, True, False), (30, False, False)], False) == 20
    assert wm([(10, True, True)], False) == 10  # unread bytes always count
    assert wm([(10, False, True)], False) == clock  # all finished and read
    assert wm([], False) == clock
    assert wm([(10, False, False)], True) == clock  # tail: at EOF follows clock
    assert wm([(10, True, False)], True) == 10
    assert wm([(200_000, True, False)], False) == clock  # never past clock


def test_a_caught_up_live_file_holds_at_its_last_lines_time_under_the_clock_rule() -> None:
    """As a caught-up Kafka partition: the newer of clock - slack and its last line's time,
    never past now; unknown (None) is the clock rule alone; creation mode ignores it."""
    clock = 100_000
    now = clock + 2_000
    live = (10, False, False)
    assert event_watermark([(*live, clock + 1_500)], clock, True, now) == clock + 1_500
    assert event_watermark([(*live, clock - 5_000)], clock, True, now) == clock  # old line
    assert event_watermark([(*live, now + 60_000)], clock, True, now) == now  # ahead of clock
    assert event_watermark([(*live, None)], clock, True, now) == clock
    assert event_watermark([(*live, clock + 1_500)], clock, False, now) == 10  # creation mode
    # The minimum over files: an unread one still holds at its creation time.
    views = [(*live, clock + 1_500), (50, True, False, None)]
    assert event_watermark(views, clock, True, now) == 50
    # A finished, fully read file holds nothing, whatever its last line says.
    assert event_watermark([(10, False, True, clock - 9_000)], clock, True, now) == clock


# --- planning ------------------------------------------------------------------------------------
def test_partial_line_is_held_back_until_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, line("a", T0) + b'{"key": "b", "ts"')
    planner = make_planner(tmp_path)
    p0 = Position.initial()
    p1 = planner.plan(p0, T0, Budget())
    assert keys(rows(tmp_path, p0, p1)) == [b"a"]
    assert planner.plan(p1, T0, Budget()) is p1  # nothing new: same offset, no batch
    write(log, b": %d}\n" % (T0 + 1))
    p2 = planner.plan(p1, T0 + 5, Budget())
    assert [(r["key"], r["timestamp"], r["offset"]) for r in rows(tmp_path, p1, p2)] == [
        (b"b", T0 + 1, len(line("a", T0)))
    ]


def test_rotation_by_rename_is_followed_by_identity(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, line("a", T0) + line("b", T0))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget(rows=1))
    assert keys(rows(tmp_path, Position.initial(), p1)) == [b"a"]
    # logrotate: the writer's last line lands in the old file after the rename
    os.rename(log, tmp_path / "app.log.1")
    write(tmp_path / "app.log.1", line("c", T0))
    write(log, line("d", T0 + 1))
    p2 = planner.plan(p1, T0 + 10, Budget())
    got = rows(tmp_path, p1, p2)
    assert sorted(keys(got)) == [b"b", b"c", b"d"]
    old = [t for t in p2.files.values() if t.name == "app.log.1"]
    assert len(old) == 1 and old[0].key in p1.files  # same identity under its new name
    ids = {r["id"] for r in rows(tmp_path, Position.initial(), p2)}
    assert len(ids) == 4


def test_files_not_matching_the_pattern_are_not_picked_up(tmp_path: Path) -> None:
    write(tmp_path / "app.log.1", line("old", T0))
    write(tmp_path / "notes.txt", line("x", T0))
    write(tmp_path / "app.log", line("a", T0))
    p1 = make_planner(tmp_path).plan(Position.initial(), T0, Budget())
    assert [t.name for t in p1.files.values()] == ["app.log"]


def test_inode_reuse_after_truncation_starts_a_new_generation(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, line("a", T0) + line("b", T0) + b"partial")
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget())
    old_key = next(iter(p1.files))
    # copytruncate: same inode, new content
    log.write_bytes(line("zz", T0 + 5))
    p2 = planner.plan(p1, T0 + 10, Budget())
    assert old_key not in p2.files
    (new_key,) = p2.files
    assert new_key.split(":")[:2] == old_key.split(":")[:2]  # same (dev, ino), new generation
    assert p2.lost == {old_key: (p1.files[old_key].offset, "app.log")}  # the partial line
    assert p2.counts == {"lost": 1}
    got = rows(tmp_path, p1, p2)
    assert [r["key"] for r in got if r["error"] is None] == [b"zz"]
    (lost,) = [r for r in got if r["error"] is not None]
    assert lost["source"] == old_key and lost["offset"] == p1.files[old_key].offset
    assert "lost" in lost["error"] and "app.log" in lost["error"]
    ids_before = {r["id"] for r in rows(tmp_path, Position.initial(), p1)}
    assert not ids_before & {r["id"] for r in got}


def copytruncate(log: Path, copy: Path, then: bytes = b"") -> None:
    """logrotate's copytruncate: copy the file, then truncate it in place (same inode)."""
    shutil.copyfile(log, copy)
    with open(log, "r+b") as fh:
        fh.truncate(0)
    write(log, then)


@pytest.mark.parametrize("pattern", ["*.log", "app.log*"])
def test_copytruncate_reads_the_rest_from_the_copy_under_the_same_ids(
    tmp_path: Path, pattern: str
) -> None:
    # Whether the pattern picks up the copy or not: the lines written after the last scan are
    # read from the copy with the ids they would have had, nothing is read twice or reported
    # lost, and what the writer writes into the truncated file is a new generation.
    log = tmp_path / "app.log"
    write(log, line("a", T0) + line("b", T0))
    planner = Planner(
        str(tmp_path), pattern, RULES, partial(first_line_timestamp, JsonLinesParser())
    )
    p1 = planner.plan(Position.initial(), T0, Budget())
    first = rows(tmp_path, Position.initial(), p1)
    (key,) = p1.files
    write(log, line("c", T0 + 1))  # written after the scan, before the rotation
    copytruncate(log, tmp_path / "app.log.1", then=line("d", T0 + 2))
    p2 = planner.plan(p1, T0 + 10, Budget())
    assert p2.lost == {} and p2.counts == {"copytruncated": 1}
    assert p2.files[key].name == "app.log.1" and p2.files[key].at is not None
    got = rows(tmp_path, p1, p2)
    assert keys(got) == [b"c", b"d"] and all(r["error"] is None for r in got)
    (c,) = [r for r in got if r["key"] == b"c"]
    assert c["source"] == key  # the original's identity: its ids
    (d,) = [r for r in got if r["key"] == b"d"]
    assert d["source"] != key and d["source"].split(":")[:2] == key.split(":")[:2]
    assert not {r["id"] for r in first} & {r["id"] for r in got}
    # The position survives Spark's offset log, copy and all; nothing more to read.
    assert Position.from_offset(json.loads(json.dumps(p2.to_offset()))) == p2
    p3 = planner.plan(p2, T0 + 20, Budget())
    assert rows(tmp_path, p2, p3) == []


def test_a_copy_seen_before_the_truncation_is_not_read_as_a_new_file(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, line("a", T0) + line("b", T0))
    planner = Planner(
        str(tmp_path), "app.log*", RULES, partial(first_line_timestamp, JsonLinesParser())
    )
    p1 = planner.plan(Position.initial(), T0, Budget())
    shutil.copyfile(log, tmp_path / "app.log.1")  # logrotate copied; the truncation comes next
    p2 = planner.plan(p1, T0 + 1, Budget())
    assert [t.name for t in p2.files.values()] == ["app.log"]
    assert rows(tmp_path, p1, p2) == []
    with open(log, "r+b") as fh:
        fh.truncate(0)
    write(log, line("d", T0 + 2))
    p3 = planner.plan(p2, T0 + 2, Budget())
    assert keys(rows(tmp_path, p2, p3)) == [b"d"] and p3.lost == {}
    # A file that only starts like a followed one is a file of its own, and is read.
    write(tmp_path / "app.log.2", line("a", T0) + line("x", T0))
    p4 = planner.plan(p3, T0 + 3, Budget())
    assert keys(rows(tmp_path, p3, p4)) == [b"a", b"x"]


def test_a_batch_planned_before_copytruncate_reads_the_same_rows_after_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "app.log"
    write(log, line("a", T0) + line("b", T0))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget())
    before = rows(tmp_path, Position.initial(), p1)
    copytruncate(log, tmp_path / "app.log.1", then=line("d", T0 + 2))
    assert rows(tmp_path, Position.initial(), p1) == before  # Spark replays the batch


def test_a_file_created_and_rotated_while_the_pipeline_was_down_is_read(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    write(tmp_path / "app.log.7", line("history", now), mtime_ms=now - 60_000)
    write(tmp_path / "app.log", line("a", now))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), now, Budget())
    assert keys(rows(tmp_path, Position.initial(), p1)) == [b"a"]  # *.log only, at first
    # Down: app.log rotated to app.log.1, a new app.log written and rotated to app.log.2
    # (never seen as app.log), a third app.log, and logrotate's compressed copy of an old one.
    time.sleep(0.01)
    os.rename(tmp_path / "app.log", tmp_path / "app.log.1")
    write(tmp_path / "app.log.2", line("b", now + 1))
    write(tmp_path / "app.log", line("c", now + 2))
    write(tmp_path / "app.log.3.gz", b"\x1f\x8b not lines")
    p2 = planner.plan(p1, now + 1_000, Budget())
    assert sorted(keys(rows(tmp_path, p1, p2))) == [b"b", b"c"]
    assert sorted(t.name for t in p2.files.values()) == ["app.log", "app.log.1", "app.log.2"]
    assert p2.counts == {"rotated_unseen": 1}


def test_rotated_names() -> None:
    for name in ("app.log.1", "app.log-20261127", "app.log.12"):
        assert rotated_name(name, "*.log"), name
    for name in ("app.log.1.gz", "app.txt.1", "notes", "app.log"):
        assert not rotated_name(name, "*.log"), name


def test_vanished_file_read_to_the_end_is_forgotten_quietly(tmp_path: Path) -> None:
    write(tmp_path / "a.log", line("a", T0))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget())
    (tmp_path / "a.log").unlink()
    p2 = planner.plan(p1, T0 + 1, Budget())
    assert p2.files == {} and p2.lost == {}


def test_read_limits_take_oldest_files_first(tmp_path: Path) -> None:
    write(tmp_path / "new.log", line("n1", T0) + line("n2", T0), mtime_ms=T0)
    write(tmp_path / "old.log", line("o1", T0 - 9) + line("o2", T0 - 9), mtime_ms=T0 - 9)
    planner = make_planner(tmp_path)
    p0 = Position.initial()
    p1 = planner.plan(p0, T0, Budget(rows=3))
    assert keys(rows(tmp_path, p0, p1)) == [b"n1", b"o1", b"o2"]  # slices are ordered by key
    p2 = planner.plan(p1, T0, Budget(rows=3))
    assert keys(rows(tmp_path, p1, p2)) == [b"n2"]
    size = len(line("o1", T0 - 9))
    p1b = planner.plan(p0, T0, Budget(bytes=size + 1))
    assert keys(rows(tmp_path, p0, p1b)) == [b"o1"]


def test_splitting_a_range_into_partitions_loses_and_doubles_nothing(tmp_path: Path) -> None:
    write(tmp_path / "app.log", b"".join(line(f"k{i}", T0 + i) for i in range(50)))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget())
    parts = slices(Position.initial(), p1, 37)
    assert len(parts) > 10 and all(isinstance(p, FileSlice) for p in parts)
    assert keys(rows(tmp_path, Position.initial(), p1, chunk=37)) == [
        f"k{i}".encode() for i in range(50)
    ]


def test_watermark_follows_figure_10_and_is_monotonic(tmp_path: Path) -> None:
    planner = make_planner(tmp_path)
    write(tmp_path / "a.log", line("a", T0 - 50_000), mtime_ms=T0 - 60_000)
    p1 = planner.plan(Position.initial(), T0, Budget())
    assert p1.wm[0] == T0 - 60_000  # creation = min(mtime, first line's event time)
    write(tmp_path / "b.log", line("b", T0 - 20_000), mtime_ms=T0 - 30_000)
    p2 = planner.plan(p1, T0 + 1_000, Budget())
    # a.log is quiet for 61 s and b.log is newer: a is finished and read; b holds the watermark
    assert p2.wm[0] == T0 - 30_000
    p3 = planner.plan(p2, T0 + 50_000, Budget())  # b is the newest: never finished
    assert p3.wm[0] == T0 - 30_000
    write(tmp_path / "c.log", b"", mtime_ms=T0 + 45_000)
    p4 = planner.plan(p3, T0 + 50_000, Budget())
    assert p4.wm[0] == T0 + 45_000  # b finished and read; c (empty) created at its mtime
    # a late file with an old mtime cannot pull the published watermark back
    write(tmp_path / "d.log", line("late", T0 - 90_000), mtime_ms=T0 - 90_000)
    p5 = planner.plan(p4, T0 + 51_000, Budget())
    assert p5.wm[0] == p4.wm[0]
    assert p5.wm[1] >= p4.wm[1] >= p3.wm[1]


def test_watermark_follows_clock_minus_slack_when_all_is_finished(tmp_path: Path) -> None:
    tail = Rules(finished_after_ms=10_000, slack_ms=2_000, tick_ms=1_000, tail_clock=True)
    write(tmp_path / "a.log", line("a", T0 - 5_000), mtime_ms=T0 - 5_000)
    p1 = make_planner(tmp_path, tail).plan(Position.initial(), T0 + 500, Budget())
    assert p1.tick == (T0 + 500) // 1_000
    assert p1.wm[0] == p1.tick * 1_000 - 2_000  # read to the end: clock - slack
    strict = make_planner(tmp_path).plan(Position.initial(), T0 + 500, Budget())
    assert strict.wm[0] == T0 - 5_000  # strict Figure 10: a live file holds it at creation


def test_tick_alone_produces_a_new_offset(tmp_path: Path) -> None:
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget())
    assert planner.plan(p1, T0 + 999, Budget()) is p1
    p2 = planner.plan(p1, T0 + 1_000, Budget())
    assert p2.tick == p1.tick + 1 and p2.wm[0] == p1.wm[0] + 1_000


def test_available_now_caps_stop_at_the_snapshot(tmp_path: Path) -> None:
    write(tmp_path / "a.log", line("a", T0))
    caps = {i: e.size for i, e in scan_directory(str(tmp_path), "*.log").items()}
    write(tmp_path / "a.log", line("b", T0))
    write(tmp_path / "new.log", line("n", T0))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget(), caps)
    assert keys(rows(tmp_path, Position.initial(), p1)) == [b"a"]
    assert planner.plan(p1, T0, Budget(), caps) is p1  # fixed point: the query can end


def test_offset_json_round_trip(tmp_path: Path) -> None:
    write(tmp_path / "a.log", line("a", T0) + b"part")
    p1 = make_planner(tmp_path).plan(Position.initial(), T0, Budget())
    offset = json.loads(json.dumps(p1.to_offset()))
    assert set(offset) == {"v", "files", "meta", "lost", "wm", "tick"}
    assert Position.from_offset(offset) == p1
    with pytest.raises(ValueError, match="start a new checkpoint"):
        Position.from_offset({**offset, "v": 99})


def test_lost_slices_become_error_rows(tmp_path: Path) -> None:
    end = Position({}, {"1:2:3": (40, "gone.log")}, (0, T0), 0)
    (part,) = slices(Position.initial(), end, 100)
    assert isinstance(part, LostSlice)
    (row,) = rows(tmp_path, Position.initial(), end)
    assert row["offset"] == 40 and row["source"] == "1:2:3" and row["system_time"] == T0
    assert "gone.log" in row["error"]


def test_a_file_hidden_from_one_listing_by_a_rename_is_not_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import millstream.injectors._logfile_plan as plan_module

    write(tmp_path / "app.log", line("a", T0))
    planner = make_planner(tmp_path)
    p1 = planner.plan(Position.initial(), T0, Budget())
    real = plan_module.scan_directory
    calls = []

    def racy(directory: str, pattern: str) -> dict:
        calls.append(1)
        return {} if len(calls) == 1 else real(directory, pattern)  # first listing misses it

    monkeypatch.setattr(plan_module, "scan_directory", racy)
    write(tmp_path / "app.log", line("b", T0))
    p2 = planner.plan(p1, T0 + 1, Budget())
    assert len(calls) == 2 and p2.lost == {} and p2.files.keys() == p1.files.keys()
    assert keys(rows(tmp_path, p1, p2)) == [b"b"]


def test_a_partial_last_line_does_not_hold_the_watermark_but_unread_lines_do(
    tmp_path: Path,
) -> None:
    """The writer mid-line: the file is caught up, so with the clock rule it follows the clock
    less the slack. Complete lines a budget left unread hold it at the file's creation."""
    tail = Rules(finished_after_ms=10_000, slack_ms=2_000, tick_ms=1_000, tail_clock=True)
    planner = make_planner(tmp_path, tail)
    write(tmp_path / "a.log", line("a", T0 - 5_000) + b'{"key": "b", "ts": ', mtime_ms=T0 - 5_000)
    p1 = planner.plan(Position.initial(), T0 + 500, Budget())
    assert keys(rows(tmp_path, Position.initial(), p1)) == [b"a"]  # the partial line waits
    assert p1.wm[0] == p1.tick * 1_000 - 2_000
    write(tmp_path / "a.log", b"%d}\n" % (T0 + 600) + line("c", T0 + 700) + line("d", T0 + 800))
    p2 = planner.plan(p1, T0 + 1_500, Budget(rows=1))  # "b" admitted, "c" and "d" unread
    assert keys(rows(tmp_path, p1, p2)) == [b"b"]
    assert p2.wm[0] == p1.wm[0]  # held at the creation (T0 - 5 s); never back
    p3 = planner.plan(p2, T0 + 2_500, Budget())
    assert keys(rows(tmp_path, p2, p3)) == [b"c", b"d"]
    # Caught up again: the last line ("d", T0 + 800) is newer than the clock less the slack.
    assert p3.tick * 1_000 - 2_000 < T0 + 800
    assert p3.wm[0] == T0 + 800


def test_a_caught_up_file_follows_its_last_line_not_the_slack(tmp_path: Path) -> None:
    """The clock rule with data: a live file read to its end holds the watermark at its last
    line's time when that is newer than the clock less the slack, so windows close as soon as
    a later line arrived; a line that does not parse, or a file gone quiet, leaves the slack."""
    tail = Rules(finished_after_ms=10_000, slack_ms=2_000, tick_ms=1_000, tail_clock=True)
    planner = make_planner(tmp_path, tail)
    write(tmp_path / "a.log", line("a", T0 - 300) + line("b", T0 - 100))
    p1 = planner.plan(Position.initial(), T0, Budget())
    assert p1.wm[0] == T0 - 100  # not T0 - 2 s
    write(tmp_path / "a.log", b"not json\n")
    p2 = planner.plan(p1, T0 + 1_000, Budget())
    assert p2.wm[0] == p1.wm[0]  # unknown: the clock rule (T0 - 1 s), and never back
    p3 = planner.plan(p2, T0 + 5_000, Budget())
    assert p3.wm[0] == T0 + 3_000  # quiet: the clock less the slack
    write(tmp_path / "a.log", line("c", T0 + 90_000))  # a skewed writer, ahead of the clock
    p4 = planner.plan(p3, T0 + 6_000, Budget())
    assert p4.wm[0] == T0 + 6_000  # never past now


def test_the_runtimes_idle_slack_is_the_default_slack_and_the_clock_rule_the_default(
    tmp_path: Path,
) -> None:
    from millstream.injectors.logfile import LogFileOptions

    base = {"path": str(tmp_path), "stream": "s"}
    assert LogFileOptions.from_options(base).tail_watermark == "clock"
    assert LogFileOptions.from_options(base).watermark_slack_ms == 5_000
    given = LogFileOptions.from_options({**base, "idleSlackMs": "2000"})
    assert given.watermark_slack_ms == 2_000
    both = LogFileOptions.from_options({**base, "idleSlackMs": "2000", "watermarkSlackMs": "700"})
    assert both.watermark_slack_ms == 700


def test_last_line_timestamp_reads_only_the_last_complete_line(tmp_path: Path) -> None:
    from millstream.injectors._logfile_lines import PROBE

    parser = JsonLinesParser()
    path = tmp_path / "a.log"
    write(path, line("a", T0) + line("b", T0 + 5) + b"x" * 100 + b"\n")
    body = path.read_bytes()
    with open(path, "rb") as fh:
        assert last_line_timestamp(parser, fh, len(line("a", T0))) == T0  # the first line
        end = len(line("a", T0) + line("b", T0 + 5))
        assert last_line_timestamp(parser, fh, end) == T0 + 5  # the line ending there
        assert last_line_timestamp(parser, fh, len(body)) is None  # does not parse
        assert last_line_timestamp(parser, fh, end - 1) is None  # not a line end
    long = tmp_path / "long.log"
    write(long, line("a", T0) + json.dumps({"key": "b" * PROBE, "ts": T0}).encode() + b"\n")
    with open(long, "rb") as fh:
        assert last_line_timestamp(parser, fh, long.stat().st_size) is None  # past one probe
