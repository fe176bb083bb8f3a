"""Offset marks: what a shard applied of the records whose ids are their Kafka position.

A record without an id of its own gets one made of its topic, partition and offset
(`injectors/_kafka_offsets.derived_id`). For such records the catalog's per-id entries say
more than needed, because Spark reads each partition in offset order: a batch's ranges start
where the last batch's ended, a batch re-run after a failure reads exactly its logged ranges
again, a batch runs only once every shard committed the one before, and a shard applies all of
its records of a batch in one commit. So what a shard applied of one partition is every record
of its keys below one offset, its *mark*: the offset after the highest it committed. A record
below the mark is a replay (dropped and counted, as the catalog would); at or above it, new.
One Redis hash field per partition and shard, written in the shard's commit, replaces 16
catalog bytes, two hashes and a Bloom probe per record.

- A mark is kept with the newest system time of the records that moved it. One older than the
  garbage-collection watermark is dropped, as the catalog's buckets are: a record that old is a
  remnant anyway, and a recreated topic (offsets from 0 again) is not dropped for ever.
- A partition without a live mark is decided by the catalog (its records still written there):
  an application upgraded from the catalog-only version finds its last batch's ids.
- A rescale gives each new shard the marks of the old shards its keys come from, each
  *inherited* mark qualified by the keys it covers (hash modulo the old count = the old shard):
  a merge may join an old shard that committed a batch with one that had not. A record is
  below a mark if below its shard's own mark or an inherited mark covering its key; an
  inherited mark is dropped once the shard's own mark passed it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from millstream.state.keys import shard_of

Mark = tuple[int, int]  # (next offset, newest system time of the records that moved it)
# A field is the partition's 8-byte id prefix, followed for an inherited mark by
# b"/<modulus>:<residue>". The prefix is binary (a hash and the partition number) and may hold
# any byte, b"/" included: fields are split by length, never by searching for the separator.
PREFIX_BYTES = 8
_QUALIFIER = b"/"


def encode(mark: Mark) -> bytes:
    return f"{mark[0]}:{mark[1]}".encode()


def decode(raw: bytes | str) -> Mark:
    text = raw.decode() if isinstance(raw, bytes) else raw
    offset, system_time = text.split(":")
    return int(offset), int(system_time)


def inherited_field(prefix: bytes, modulus: int, residue: int) -> bytes:
    return prefix + _QUALIFIER + f"{modulus}:{residue}".encode()


def split_field(name: bytes) -> tuple[bytes, tuple[int, int] | None]:
    """A field's partition prefix and, for an inherited mark, its (modulus, residue)."""
    prefix, rest = name[:PREFIX_BYTES], name[PREFIX_BYTES:]
    if not rest:
        return prefix, None
    if not rest.startswith(_QUALIFIER):
        raise ValueError(f"offset mark field {name!r}: not an 8-byte prefix and a qualifier")
    modulus, residue = rest[len(_QUALIFIER) :].decode().split(":")
    return prefix, (int(modulus), int(residue))


# A run of records of one partition whose ids are their position, in offset order: the
# partition's id prefix, and the records' offsets, keys and system times.
Run = tuple[bytes, list[int], list[str], list[int]]


@dataclass
class OffsetMarks:
    """One shard's marks as its owner read them at acquire, and this batch's moves of them."""

    own: dict[bytes, Mark] = field(default_factory=dict)
    inherited: dict[bytes, list[tuple[int, int, Mark]]] = field(default_factory=dict)
    _moved: dict[bytes, Mark] = field(default_factory=dict)

    @classmethod
    def parse(cls, reply: dict[bytes, bytes]) -> OffsetMarks:
        """Take the shard's mark hash (HGETALL)."""
        marks = cls()
        for name, raw in reply.items():
            prefix, qualifier = split_field(name if isinstance(name, bytes) else name.encode())
            if qualifier is None:
                marks.own[prefix] = decode(raw)
            else:
                marks.inherited.setdefault(prefix, []).append((*qualifier, decode(raw)))
        return marks

    def applied(self, run: Run, gc_watermark: int) -> list[bool | None] | None:
        """Per record of the run: True if below a live mark covering its key (applied before),
        False if not (new), None if no live mark covers it (the catalog decides); None for the
        whole run if its partition has no live mark. The run moves its partition's mark
        (`writes`), whatever the answer."""
        prefix, offsets, keys, times = run
        if not offsets:
            return []
        own = self.own.get(prefix)
        bound = own[0] if own is not None and own[1] >= gc_watermark else None
        inherited = [m for m in self.inherited.get(prefix, ()) if m[2][1] >= gc_watermark]
        last = self._moved.get(prefix, (0, 0))
        self._moved[prefix] = (max(offsets[-1] + 1, last[0]), max(max(times), last[1]))
        if not inherited:  # offsets ascend: the records below the bound come first
            if bound is None:
                return None
            below = bisect.bisect_left(offsets, bound)
            answers: list[bool | None] = [True] * below
            return answers + [False] * (len(offsets) - below)
        out: list[bool | None] = []
        for offset, key in zip(offsets, keys, strict=True):
            limit = bound
            for modulus, residue, mark in inherited:
                if shard_of(key, modulus) == residue and (limit is None or mark[0] > limit):
                    limit = mark[0]
            out.append(None if limit is None else offset < limit)
        return out

    def writes(self, gc_watermark: int) -> tuple[dict[bytes, bytes], list[bytes]]:
        """The fields this batch's commit sets (marks moved) and deletes (marks expired, or
        inherited marks the shard's own mark has passed)."""
        sets: dict[bytes, bytes] = {}
        drops: list[bytes] = []
        for prefix, (offset, system_time) in self._moved.items():
            old = self.own.get(prefix)
            if old is not None and old[1] >= gc_watermark:
                offset, system_time = max(offset, old[0]), max(system_time, old[1])
            sets[prefix] = encode((offset, system_time))
        for prefix, mark in self.own.items():
            if prefix not in sets and mark[1] < gc_watermark:
                drops.append(prefix)
        for prefix, marks in self.inherited.items():
            own_next = decode(sets[prefix])[0] if prefix in sets else None
            for modulus, residue, mark in marks:
                passed = own_next is not None and own_next >= mark[0]
                if passed or mark[1] < gc_watermark:
                    drops.append(inherited_field(prefix, modulus, residue))
        return sets, drops


def inherit(
    sources: Iterable[tuple[int, dict[bytes, bytes]]], old_shards: int
) -> dict[bytes, bytes]:
    """A new shard's marks after a rescale from `old_shards` shards: `sources` holds (old shard
    number, its mark hash) for every old shard its keys can come from. Own marks become
    inherited ones qualified by the old shard's keys; inherited ones keep their qualifier (a
    split copies them to both halves unchanged, so copies of one are equal)."""
    out: dict[bytes, Mark] = {}
    for shard, reply in sources:
        for name, raw in reply.items():
            name = name if isinstance(name, bytes) else name.encode()
            prefix, qualifier = split_field(name)
            target = name if qualifier else inherited_field(prefix, old_shards, shard)
            mark = decode(raw)
            seen = out.get(target)
            out[target] = mark if seen is None else max(seen, mark)
    return {name: encode(mark) for name, mark in out.items()}
