"""FileSink: atomic JSON-lines files; replays write no duplicate and no partial file."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from millstream.errors import ConfigurationError
from millstream.records import Production
from millstream.sinks.base import SKIPPED_DELIVERED, ShardRef
from millstream.sinks.file_sink import FileSink

SHARD = ShardRef("app", "comp", 2)


def productions(first: int, last: int, stream: str = "out") -> list[Production]:
    return [
        Production(stream, f"k{s}", f"v{s}".encode(), 100 + s, f"id{s}".encode(), 200 + s, seq=s)
        for s in range(first, last)
    ]


def lines(root: Path) -> list[dict]:
    out = []
    for path in sorted(root.rglob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def test_replays_write_each_production_once(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, fsync=False)
    sink.setup()
    report = sink.deliver(SHARD, productions(0, 5))
    folder = sink.shard_dir(SHARD, "out")
    assert [p.name for p in folder.iterdir()] == [f"{0:020d}-{4:020d}.jsonl"]
    assert [d.offset for d in report.deliveries] == [0, 1, 2, 3, 4]

    again = sink.deliver(SHARD, productions(0, 5))  # the same productions after a crash
    assert {d.skipped for d in again.deliveries} == {SKIPPED_DELIVERED}
    grown = sink.deliver(SHARD, productions(0, 9))  # older checkpoints plus new ones
    assert grown.skipped == 5 and grown.delivered == 4
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{0:020d}-{4:020d}.jsonl",
        f"{5:020d}-{8:020d}.jsonl",
    ]
    assert [line["seq"] for line in lines(tmp_path)] == list(range(9))
    first = lines(tmp_path)[0]
    assert first["id"] == b"id0".hex() and base64.b64decode(first["value"]) == b"v0"


def test_crash_before_rename_leaves_no_partial_file(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, fsync=False, stale_temp_s=0)
    folder = sink.shard_dir(SHARD, "out")
    folder.mkdir(parents=True)
    partial = folder / f".{0:020d}-{2:020d}.jsonl.999.dead.tmp"
    partial.write_text('{"seq": 0}\n{"se')  # a writer killed mid-file
    old = time.time() - 10
    os.utime(partial, (old, old))
    sink.deliver(SHARD, productions(0, 3))
    assert [p.name for p in folder.iterdir()] == [f"{0:020d}-{2:020d}.jsonl"]
    assert [line["seq"] for line in lines(tmp_path)] == [0, 1, 2]


def test_streams_get_their_own_folders_and_utf8_values(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, value_encoding="utf-8", fsync=True)
    mixed = [*productions(0, 2, "a"), *productions(0, 2, "b")]
    mixed.append(Production("b", "k", b"\xff", 1, b"bin", 2, seq=7))
    sink.deliver(SHARD, mixed)
    assert lines(sink.shard_dir(SHARD, "a"))[0]["value"] == "v0"
    binary = lines(sink.shard_dir(SHARD, "b"))[-1]
    assert "value" not in binary and base64.b64decode(binary["value_b64"]) == b"\xff"


def test_unwritable_folder_fails_setup(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigurationError, match="not writable"):
        FileSink(blocker / "sub").setup()
