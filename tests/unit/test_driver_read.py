"""The driver read's batch ranges: batch 0 from the sources' kept first starts."""

from __future__ import annotations

import json
from pathlib import Path

from millstream.connectors.driver_read import OffsetLog


def _offset(position: int) -> dict:
    return {"p": {"t:0": position}, "wm": [0, 0], "tick": 1}


def _log(checkpoint: Path, batch: int, *entries: dict) -> None:
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0}), *(json.dumps(e) for e in entries)]
    (folder / str(batch)).write_text("\n".join(lines))


def test_batch_zero_starts_at_the_kept_first_start_and_later_batches_at_the_log(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "fused"
    kept = tmp_path / "fused" / "millstream-starts" / "a.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(_offset(3)))
    _log(checkpoint, 0, _offset(7))
    _log(checkpoint, 1, _offset(9))
    kafka = ("millstream-kafka", {"topics": "t", "startFile": str(kept)})
    log = OffsetLog(str(checkpoint))
    assert log.ranges(0, [kafka]) == [(_offset(3), _offset(7))]
    assert log.ranges(1, [kafka]) == [(_offset(7), _offset(9))]


def test_batch_zero_is_left_to_spark_without_a_kept_start_for_every_source(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "fused"
    _log(checkpoint, 0, _offset(7), _offset(8))
    kept = tmp_path / "s.json"
    kept.write_text(json.dumps(_offset(3)))
    log = OffsetLog(str(checkpoint))
    with_file = ("millstream-kafka", {"topics": "t", "startFile": str(kept)})
    assert log.ranges(0, [("millstream-kafka", {"topics": "t"}), with_file]) is None
    missing = ("millstream-kafka", {"topics": "t", "startFile": str(tmp_path / "none.json")})
    assert log.ranges(0, [with_file, missing]) is None
    assert log.ranges(0, [with_file, ("millstream-logfile", {"path": "x"})]) is None
