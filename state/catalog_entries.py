"""What the record-id catalog keeps of an applied record: a 16-byte packed entry.

MillWheel's catalog must remember every applied record id until garbage collection passes its
bucket; kept as a Redis hash field id -> delivery position that cost ~117 bytes per id. An entry
is instead a 96-bit fingerprint of the id (the first 12 bytes of its mmh3 x64 128-bit hash) and a
32-bit hash of the position it was delivered from. The fingerprint says "applied before" (a
wrong yes would drop a new record, so it is long: see README, "What retention costs"); the
position hash only tells a replay from a duplicate, both of which are dropped. Entries go to
one of `GROUPS` groups per bucket, chosen by other bits of the same hash, so a look-up reads
1/64 of a bucket (where a group is kept: `catalog.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import mmh3

SEED = 0x6D696C6C  # the ids' fingerprint; the Bloom filters hash fingerprints with their own seed
FINGERPRINT_BYTES = 12
POSITION_BYTES = 4
ENTRY_BYTES = FINGERPRINT_BYTES + POSITION_BYTES
GROUPS = 64  # strings per bucket: 75k ids -> 19 KB read per look-up; 750 ids -> ~7 B/id of keys
_LOG_MARK = b"F"  # commit-log blobs of (bucket, fingerprint); older blobs held raw ids
_LOG_RECORD = 8 + FINGERPRINT_BYTES


# One applied record as the catalog stores it: (bucket, fingerprint, group, packed), packed
# being the fingerprint and the position hash. A plain tuple, not a NamedTuple: every applied
# record makes one, and entries built as NamedTuples cost 2.1 µs each against 0.6 as tuples.
Entry = tuple[int, bytes, int, bytes]
BUCKET: Final = 0
FINGERPRINT: Final = 1
GROUP: Final = 2
PACKED: Final = 3


def digest(rid: bytes) -> bytes:
    """The id's 128-bit hash, whence its fingerprint and group (`of_digest`): computed once per
    record, for the dedup verdict and again for the catalog write."""
    return mmh3.hash_bytes(rid, SEED)


def of_digest(digest: bytes) -> tuple[bytes, int]:
    """The fingerprint and group of an id's digest: disjoint bits of it."""
    return digest[:FINGERPRINT_BYTES], digest[FINGERPRINT_BYTES] % GROUPS


def fingerprint(rid: bytes) -> tuple[bytes, int]:
    """The id's fingerprint and group: disjoint bits of one 128-bit hash."""
    return of_digest(digest(rid))


def position_hash(position: bytes) -> bytes:
    return mmh3.hash(position, SEED, signed=False).to_bytes(POSITION_BYTES, "big")


def entries(ids: Iterable[tuple[int, bytes, bytes]]) -> list[Entry]:
    """(bucket, id, position) triples as entries."""
    return entries_of_digests((bucket, digest(rid), where) for bucket, rid, where in ids)


def entries_of_digests(ids: Iterable[tuple[int, bytes, bytes]]) -> list[Entry]:
    """(bucket, digest of the id, position) triples as entries."""
    hash32, n = mmh3.hash, FINGERPRINT_BYTES  # every record
    return [
        (bucket, d[:n], d[n] % GROUPS, d[:n] + hash32(where, SEED, signed=False).to_bytes(4, "big"))
        for bucket, d, where in ids
    ]


def group_blobs(bucket_entries: Iterable[Entry]) -> dict[int, bytes]:
    """Group -> the entries to append to it; one entry per fingerprint (the last, as HSET kept
    the last position of an id written twice in one commit)."""
    last: dict[bytes, Entry] = {}
    for entry in bucket_entries:
        last.pop(entry[FINGERPRINT], None)
        last[entry[FINGERPRINT]] = entry
    groups: dict[int, list[bytes]] = {}
    for entry in last.values():
        groups.setdefault(entry[GROUP], []).append(entry[PACKED])
    return {group: b"".join(packed) for group, packed in groups.items()}


def find(blob: bytes, fp: bytes) -> bytes | None:
    """The position hash of the last entry with fingerprint `fp` in a group's blob, if any.

    The last, since a later entry is a later delivery (what HSET's overwrite kept). A match
    that does not start on an entry boundary straddles two entries and is skipped.
    """
    end = len(blob)
    while (at := blob.rfind(fp, 0, end)) >= 0:
        if at % ENTRY_BYTES == 0:
            return blob[at + FINGERPRINT_BYTES : at + ENTRY_BYTES]
        end = at + FINGERPRINT_BYTES - 1
    return None


def fingerprints_in(blob: bytes) -> list[bytes]:
    """Every fingerprint of a group's blob (rebuilding Bloom filters)."""
    return [blob[at : at + FINGERPRINT_BYTES] for at in range(0, len(blob), ENTRY_BYTES)]


def pack_log(ids: Sequence[Entry]) -> bytes:
    """The (bucket, fingerprint) pairs of a commit, for its commit-log entry: what other
    workers add to their Bloom filters when they sync."""
    prefix: dict[int, bytes] = {}  # a commit's ids fall in a bucket or two
    for e in ids:
        if e[BUCKET] not in prefix:
            prefix[e[BUCKET]] = e[BUCKET].to_bytes(8, "big", signed=True)
    return _LOG_MARK + b"".join(prefix[e[BUCKET]] + e[FINGERPRINT] for e in ids)


def unpack_log(blob: bytes) -> list[tuple[int, bytes]] | None:
    """The pairs `pack_log` packed; None for a blob an older version wrote (raw ids, which the
    filters no longer take: the reader rebuilds its filters from the catalog instead)."""
    if not blob:
        return []
    if blob[:1] != _LOG_MARK:
        return None
    return [
        (int.from_bytes(blob[at : at + 8], "big", signed=True), blob[at + 8 : at + _LOG_RECORD])
        for at in range(1, len(blob), _LOG_RECORD)
    ]
