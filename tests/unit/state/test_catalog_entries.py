"""Packed catalog entries: fingerprints, groups, packing, look-up in a group, commit-log blobs."""

from __future__ import annotations

from collections import Counter

from millstream.state import _codec
from millstream.state import catalog_entries as ce


def test_fingerprint_is_stable_and_group_in_range() -> None:
    fp, group = ce.fingerprint(b"order-1")
    assert (fp, group) == ce.fingerprint(b"order-1")
    assert len(fp) == ce.FINGERPRINT_BYTES == 12 and 0 <= group < ce.GROUPS
    assert ce.fingerprint(b"order-2")[0] != fp


def test_groups_spread_evenly() -> None:
    counts = Counter(ce.fingerprint(f"id-{i}".encode())[1] for i in range(64_000))
    assert len(counts) == ce.GROUPS
    assert max(counts.values()) < 1.2 * 1000 and min(counts.values()) > 0.8 * 1000


def test_entries_are_16_bytes_fingerprint_then_position_hash() -> None:
    [entry] = ce.entries([(7, b"r", b"in:0:12")])
    fp, group = ce.fingerprint(b"r")
    assert entry == (7, fp, group, fp + ce.position_hash(b"in:0:12"))
    assert len(entry[ce.PACKED]) == ce.ENTRY_BYTES == 16


def test_group_blobs_keep_one_entry_per_fingerprint_the_last() -> None:
    ids = [(1, f"r{i}".encode(), b"p") for i in range(200)] + [(1, b"r0", b"q")]
    blobs = ce.group_blobs(ce.entries(ids))
    assert sum(len(b) for b in blobs.values()) == 200 * ce.ENTRY_BYTES
    fp, group = ce.fingerprint(b"r0")
    assert ce.find(blobs[group], fp) == ce.position_hash(b"q")


def test_find_returns_the_last_aligned_entry() -> None:
    fp, _ = ce.fingerprint(b"x")
    first, later = fp + ce.position_hash(b"a"), fp + ce.position_hash(b"b")
    other = ce.fingerprint(b"y")[0] + ce.position_hash(b"c")
    assert ce.find(first + other + later + other, fp) == ce.position_hash(b"b")
    assert ce.find(other, fp) is None
    assert ce.find(b"", fp) is None


def test_find_skips_a_match_straddling_two_entries() -> None:
    fp, _ = ce.fingerprint(b"x")
    # Entry 1's position hash and entry 2's fingerprint spell `fp` from offset 12.
    straddle = b"\0" * 12 + fp[:4] + fp[4:] + b"\0" * 8
    assert straddle.find(fp) == 12
    assert ce.find(straddle, fp) is None
    assert ce.find(straddle + fp + b"PPPP", fp) == b"PPPP"


def test_fingerprints_in_a_blob() -> None:
    entries = ce.entries([(1, f"r{i}".encode(), b"p") for i in range(5)])
    blob = b"".join(e[ce.PACKED] for e in entries)
    assert ce.fingerprints_in(blob) == [e[ce.FINGERPRINT] for e in entries]


def test_commit_log_round_trip_and_older_blobs() -> None:
    entries = ce.entries([(-3, b"a", b"p"), (2**40, b"b", b"q")])
    blob = ce.pack_log(entries)
    assert len(blob) == 1 + 2 * 20
    assert ce.unpack_log(blob) == [
        (-3, entries[0][ce.FINGERPRINT]),
        (2**40, entries[1][ce.FINGERPRINT]),
    ]
    assert ce.unpack_log(ce.pack_log([])) == []
    assert ce.unpack_log(b"") == []
    older = _codec.pack([(5).to_bytes(8, "big", signed=True) + b"raw-id"])  # before fingerprints
    assert ce.unpack_log(older) is None
