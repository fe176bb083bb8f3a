"""Time-bucketed Bloom filters that gate catalog look-ups (Dataflow exactly-once, part 2).

A filter answers "certainly new" or "maybe seen". Only "maybe" answers cost a catalog read in
Redis. Filters are soft state in worker memory, one per (shard, system-time bucket), so a whole
bucket is dropped at once when garbage collection passes it. False negatives never happen: every
id committed to the catalog is added to the filter of its bucket before the next check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import mmh3
import numpy as np


def optimal_shape(expected: int, fp_rate: float) -> tuple[int, int]:
    """Bits and hash count for `expected` items at false-positive rate `fp_rate`."""
    expected = max(1, expected)
    bits = math.ceil(-expected * math.log(fp_rate) / (math.log(2) ** 2))
    bits = max(64, (bits + 63) // 64 * 64)
    hashes = max(1, round(bits / expected * math.log(2)))
    return bits, hashes


def _hash_pairs(ids: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    pairs = np.array([mmh3.hash64(i, 0x5EED, signed=False) for i in ids], dtype=np.uint64)
    if not len(ids):
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    return pairs[:, 0], pairs[:, 1] | np.uint64(1)  # odd step: probes never collapse to one bit


HASHED_BYTES = 12  # a fingerprint: 64 bits for the first probe, 32 for the step


def _fingerprint_pairs(ids: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The probe pair of ids that are already uniform hashes (the catalog's 96-bit
    fingerprints): read from their bytes, all ids at once, instead of hashing each again."""
    if not len(ids):
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    joined = b"".join(ids)
    if len(joined) != HASHED_BYTES * len(ids):
        raise ValueError(f"a hashed Bloom filter takes {HASHED_BYTES}-byte fingerprints")
    rows = np.frombuffer(joined, dtype=np.uint8).reshape(-1, HASHED_BYTES)
    first = rows[:, :8].copy().view("<u8").ravel()
    step = rows[:, 8:].copy().view("<u4").ravel().astype(np.uint64)
    return first, step | np.uint64(1)


class BloomFilter:
    """A fixed-size Bloom filter over byte strings, Kirsch-Mitzenmacher double hashing."""

    __slots__ = ("_bits", "_pairs", "count", "hashes", "size")

    def __init__(self, expected: int, fp_rate: float, *, hashed: bool = False) -> None:
        """`hashed`: the ids are fingerprints (`HASHED_BYTES` of a uniform hash), whose bytes
        give the probes directly; otherwise each id is hashed (mmh3)."""
        self.size, self.hashes = optimal_shape(expected, fp_rate)
        self._bits = np.zeros(self.size // 64, dtype=np.uint64)
        self._pairs = _fingerprint_pairs if hashed else _hash_pairs
        self.count = 0

    def _positions(self, ids: Sequence[bytes]) -> np.ndarray:
        h1, h2 = self._pairs(ids)
        steps = np.arange(self.hashes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            probes = h1[:, None] + steps[None, :] * h2[:, None]
        return probes % np.uint64(self.size)

    def contains_positions(self, pos: np.ndarray) -> np.ndarray:
        """Membership for precomputed probe positions (filters of one shape share them)."""
        words = self._bits[pos >> np.uint64(6)]
        return ((words >> (pos & np.uint64(63))) & np.uint64(1)).all(axis=1)

    def add_many(self, ids: Sequence[bytes]) -> None:
        if not ids:
            return
        pos = self._positions(ids).ravel()
        np.bitwise_or.at(self._bits, pos >> np.uint64(6), np.uint64(1) << (pos & np.uint64(63)))
        self.count += len(ids)

    def contains_many(self, ids: Sequence[bytes]) -> list[bool]:
        """For each id: False means certainly absent; True means maybe present."""
        if not ids:
            return []
        return self.contains_positions(self._positions(ids)).tolist()

    def __contains__(self, item: bytes) -> bool:
        return self.contains_many([item])[0]

    @property
    def memory_bytes(self) -> int:
        return int(self._bits.nbytes)


@dataclass
class BloomStats:
    checks: int = 0
    maybe: int = 0
    false_positives: int = 0
    rebuilds: int = 0
    synced_ids: int = 0


class BucketedBloom:
    """One filter per system-time bucket of one shard (`hashed`: over fingerprints, see
    `BloomFilter`)."""

    def __init__(self, expected: int, fp_rate: float, *, hashed: bool = False) -> None:
        self.expected = expected
        self.fp_rate = fp_rate
        self.hashed = hashed
        self.filters: dict[int, BloomFilter] = {}
        self.stats = BloomStats()

    def _filter(self, bucket: int) -> BloomFilter:
        bloom = self.filters.get(bucket)
        if bloom is None:
            bloom = self.filters[bucket] = BloomFilter(
                self.expected, self.fp_rate, hashed=self.hashed
            )
        return bloom

    def add(self, bucketed: Iterable[tuple[int, bytes]]) -> None:
        by_bucket: dict[int, list[bytes]] = {}
        for bucket, rid in bucketed:
            by_bucket.setdefault(bucket, []).append(rid)
        for bucket, ids in by_bucket.items():
            self._filter(bucket).add_many(ids)

    def maybe_contains(self, bucketed: Sequence[tuple[int, bytes]]) -> list[bool]:
        """Per (bucket, id): False = certainly new; True = ask the catalog."""
        out = [False] * len(bucketed)
        by_bucket: dict[int, list[int]] = {}
        for index, (bucket, _) in enumerate(bucketed):
            by_bucket.setdefault(bucket, []).append(index)
        for bucket, indexes in by_bucket.items():
            bloom = self.filters.get(bucket)
            if bloom is None:
                continue
            answers = bloom.contains_many([bucketed[i][1] for i in indexes])
            for index, answer in zip(indexes, answers, strict=True):
                out[index] = answer
        self.stats.checks += len(bucketed)
        self.stats.maybe += sum(out)
        return out

    def maybe_in_any(self, ids: Sequence[bytes]) -> list[list[int]]:
        """Per id, the buckets whose filter says "maybe"; empty means certainly new everywhere.

        A source may send the same id again with another system time (a client retry), so an
        id is checked against every live bucket. All filters share one shape, so each id is
        hashed once and only the bit look-ups repeat per bucket.
        """
        out: list[list[int]] = [[] for _ in ids]
        if ids and self.filters:
            pos = next(iter(self.filters.values()))._positions(ids)
            for bucket, bloom in self.filters.items():
                for index in np.flatnonzero(bloom.contains_positions(pos)).tolist():
                    out[index].append(bucket)
        self.stats.checks += len(ids)
        self.stats.maybe += sum(1 for buckets in out if buckets)
        return out

    def drop_below(self, bucket: int) -> None:
        for old in [b for b in self.filters if b < bucket]:
            del self.filters[old]

    @property
    def memory_bytes(self) -> int:
        return sum(f.memory_bytes for f in self.filters.values())
