"""Line splitting, chunked reading and ids of the log-file injector (pure, no Spark)."""

from __future__ import annotations

import io
import itertools
import random

import pytest

from millstream.injectors._logfile_lines import (
    TruncatedError,
    advance_bytes,
    advance_lines,
    fingerprint_matches,
    head_fingerprint,
    iter_lines,
    last_line_end,
    record_id,
    split_complete,
    strip_cr,
)


def test_split_complete_holds_back_the_partial_last_line() -> None:
    lines, end = split_complete(b"one\ntwo\nthr", base=100)
    assert lines == [(100, b"one"), (104, b"two")]
    assert end == 108  # "thr" waits for its newline


def test_split_complete_keeps_empty_lines_and_handles_no_newline() -> None:
    assert split_complete(b"\n\nx\n") == ([(0, b""), (1, b""), (2, b"x")], 4)
    assert split_complete(b"partial") == ([], 0)
    assert split_complete(b"") == ([], 0)


def test_strip_cr_only_strips_a_trailing_carriage_return() -> None:
    assert strip_cr(b"a\r") == b"a"
    assert strip_cr(b"a\rb") == b"a\rb"


def _random_text(seed: int, lines: int) -> bytes:
    rnd = random.Random(seed)
    return b"".join(b"x" * rnd.choice([0, 1, 2, 5, 17, 40]) + b"\n" for _ in range(lines))


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 16, 64, 10_000])
@pytest.mark.parametrize("block", [1, 3, 1 << 20])
def test_chunks_partition_the_lines_exactly(chunk: int, block: int) -> None:
    """Any chunking of a range yields every line exactly once (Hadoop's line-ownership rule)."""
    data = _random_text(chunk * 31 + block, 60)
    start = split_complete(data)[0][3][0]  # a range that starts at a later line start
    expected = [x for x in split_complete(data)[0] if x[0] >= start]
    fh = io.BytesIO(data + b"partial tail never read")
    got = []
    for lo in range(start, len(data), chunk):
        hi = min(lo + chunk, len(data))
        got.extend(iter_lines(fh, lo, hi, len(data), owns_first=lo == start, block=block))
    assert got == expected


def test_iter_lines_reports_truncation() -> None:
    fh = io.BytesIO(b"a\nbb")  # the planner saw "a\nbb\n" but the file lost its last byte
    with pytest.raises(TruncatedError) as info:
        list(iter_lines(fh, 0, 5, 5, owns_first=True))
    assert info.value.position == 4


def test_last_line_end_reads_backwards_across_blocks() -> None:
    data = b"a\n" + b"y" * 50
    fh = io.BytesIO(data)
    assert last_line_end(fh, 0, len(data), block=4) == 2
    assert last_line_end(fh, 2, len(data), block=4) == 2  # only a partial line after 2
    assert last_line_end(fh, 0, 1) == 0


def test_advance_lines_counts_complete_lines_only() -> None:
    fh = io.BytesIO(b"a\nbb\nccc\ndd")
    assert advance_lines(fh, 0, 11, 2, block=3) == (5, 2)
    assert advance_lines(fh, 0, 11, 10, block=3) == (9, 3)
    assert advance_lines(fh, 9, 11, 10) == (9, 0)


def test_advance_bytes_admits_one_oversized_line_only_when_allowed() -> None:
    fh = io.BytesIO(b"aaaaaaaa\nb\n")
    assert advance_bytes(fh, 0, 11, 4, at_least_one=True) == 9
    assert advance_bytes(fh, 0, 11, 4, at_least_one=False) == 0
    assert advance_bytes(fh, 0, 11, 100, at_least_one=False) == 11


def test_record_ids_are_unique_and_stable() -> None:
    values = [0, 1, 127, 128, 300, 2**32, 2**62]
    ids = {record_id(*combo) for combo in itertools.product(values, repeat=4)}
    assert len(ids) == len(values) ** 4
    assert record_id(2049, 1234, 1_700_000_000_000, 42) == record_id(
        2049, 1234, 1_700_000_000_000, 42
    )
    assert len(record_id(2049, 12_345_678, 1_700_000_000_000, 10**9)) <= 20


def test_fingerprint_detects_a_different_head() -> None:
    first = io.BytesIO(b'{"ts": 1}\n' * 10)
    fp = head_fingerprint(first, 100)
    assert fp[0] == 64
    assert fingerprint_matches(first, fp)
    assert not fingerprint_matches(io.BytesIO(b'{"ts": 2}\n' * 10), fp)
    assert not fingerprint_matches(io.BytesIO(b""), fp)  # truncated
