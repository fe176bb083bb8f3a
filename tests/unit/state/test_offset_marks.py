"""Offset marks (`state/offset_marks.py`), pure: which records a shard's marks call applied, how
a batch moves them, when they expire, and what a rescale gives the new shards."""

from __future__ import annotations

from millstream.injectors.record_ids import derived_id, id_prefix, is_position, partition_prefix
from millstream.state.keys import shard_of
from millstream.state.offset_marks import OffsetMarks, decode, encode, inherit, inherited_field

P = id_prefix("events", 0)
Q = id_prefix("events", 1)
T = 1_700_000_000_000


def test_a_derived_id_tells_its_position_back_and_no_other() -> None:
    rid = derived_id("events", 3, 1234)
    prefix = partition_prefix("events", 3)
    assert prefix is not None and is_position(rid, prefix, 1234)
    assert not is_position(rid, prefix, 1235)  # another offset
    assert not is_position(rid, id_prefix("events", 2), 1234)  # another partition
    assert not is_position(rid, id_prefix("other", 3), 1234)  # another topic
    assert not is_position(b"x" * 16, prefix, 1234)  # an id of its own
    assert not is_position(rid, prefix, None)  # a row with no offset
    assert partition_prefix(None, 3) is None and partition_prefix("events", None) is None


def test_without_a_mark_the_catalog_decides_and_the_batch_sets_one() -> None:
    marks = OffsetMarks()
    assert marks.applied((P, [10, 11], ["a", "b"], [T, T + 5]), gc_watermark=0) is None
    sets, drops = marks.writes(gc_watermark=0)
    assert sets == {P: encode((12, T + 5))} and drops == []


def test_below_the_mark_is_applied_at_or_above_it_new() -> None:
    marks = OffsetMarks(own={P: (100, T)})
    got = marks.applied((P, [99, 100, 250], ["a", "a", "b"], [T, T, T + 1]), 0)
    assert got == [True, False, False]
    sets, _ = marks.writes(0)
    assert decode(sets[P]) == (251, T + 1)


def test_a_replayed_batch_never_moves_a_mark_back() -> None:
    marks = OffsetMarks(own={P: (500, T + 9)})
    assert marks.applied((P, [10], ["a"], [T]), 0) == [True]
    sets, _ = marks.writes(0)
    assert decode(sets[P]) == (500, T + 9)


def test_partitions_are_independent() -> None:
    marks = OffsetMarks(own={P: (100, T)})
    assert marks.applied((Q, [5], ["a"], [T]), 0) is None
    assert marks.applied((P, [5], ["a"], [T]), 0) == [True]


def test_an_expired_mark_is_ignored_and_dropped() -> None:
    marks = OffsetMarks(own={P: (100, T), Q: (7, T)})
    assert marks.applied((P, [5], ["a"], [T + 2000]), gc_watermark=T + 1000) is None
    sets, drops = marks.writes(gc_watermark=T + 1000)
    assert decode(sets[P]) == (6, T + 2000)  # not max'ed with the expired mark
    assert drops == [Q]


def test_an_inherited_mark_covers_only_its_keys() -> None:
    keys = [f"k{i}" for i in range(200)]
    a = [k for k in keys if shard_of(k, 2) == 0]
    b = [k for k in keys if shard_of(k, 2) == 1]
    # Merged from 2 shards: old shard 0 committed up to offset 150, old shard 1 up to 99.
    marks = OffsetMarks(inherited={P: [(2, 0, (150, T)), (2, 1, (99, T))]})
    got = marks.applied((P, [90, 120, 120], [b[1], a[0], b[0]], [T] * 3), 0)
    assert got == [True, True, False]
    # Merged with a third old shard that had no mark: its keys are the catalog's, one by one.
    marks = OffsetMarks(inherited={P: [(3, 0, (150, T))]})
    c = next(k for k in keys if shard_of(k, 3) == 0)
    d = next(k for k in keys if shard_of(k, 3) == 1)
    assert marks.applied((P, [10, 10], [c, d], [T, T]), 0) == [True, None]


def test_inherited_marks_are_dropped_once_the_own_mark_passed_them() -> None:
    marks = OffsetMarks(inherited={P: [(2, 0, (150, T)), (2, 1, (99, T))]})
    marks.applied((P, [120], ["x"], [T]), 0)
    sets, drops = marks.writes(0)
    assert decode(sets[P]) == (121, T)
    assert drops == [inherited_field(P, 2, 1)]  # 99 <= 121; 150 still bounds old shard 0's keys


def test_inherit_qualifies_own_marks_and_keeps_inherited_ones() -> None:
    old_0 = {P: encode((150, T)), inherited_field(Q, 8, 3): encode((40, T))}
    old_2 = {P: encode((99, T + 1))}
    got = inherit([(0, old_0), (2, old_2)], old_shards=4)
    assert got == {
        inherited_field(P, 4, 0): encode((150, T)),
        inherited_field(P, 4, 2): encode((99, T + 1)),
        inherited_field(Q, 8, 3): encode((40, T)),
    }
    parsed = OffsetMarks.parse(got)
    assert parsed.own == {} and len(parsed.inherited[P]) == 2


def test_a_prefix_holding_the_separator_byte_is_read_back() -> None:
    # Partition 47 is b"/" in the prefix's last byte; the topic hash may hold it anywhere.
    slash = id_prefix("events", 47)
    assert slash.endswith(b"/")
    stored = {slash: encode((9, T)), inherited_field(slash, 4, 1): encode((5, T))}
    parsed = OffsetMarks.parse(stored)
    assert parsed.own == {slash: (9, T)} and parsed.inherited == {slash: [(4, 1, (5, T))]}
    got = inherit([(2, stored)], old_shards=4)
    assert OffsetMarks.parse(got).inherited[slash] == [(4, 2, (9, T)), (4, 1, (5, T))]
