"""Bloom filter properties: no false negatives, measured false-positive rate near the target."""

from __future__ import annotations

import pytest

from millstream.state.bloom import BloomFilter, BucketedBloom, optimal_shape
from millstream.state.catalog_entries import fingerprint


def test_shape_grows_with_precision() -> None:
    bits_1, hashes_1 = optimal_shape(1000, 0.01)
    bits_2, hashes_2 = optimal_shape(1000, 0.001)
    assert bits_2 > bits_1 and hashes_2 > hashes_1


def test_false_positive_rate_within_2x_over_a_million_ids() -> None:
    target = 0.01
    bloom = BloomFilter(1_000_000, target)
    members = [f"member-{i}".encode() for i in range(1_000_000)]
    bloom.add_many(members)
    assert all(bloom.contains_many(members)), "a Bloom filter must never give a false negative"
    probes = [f"stranger-{i}".encode() for i in range(1_000_000)]
    rate = sum(bloom.contains_many(probes)) / len(probes)
    print(f"measured false-positive rate {rate:.5f} (target {target})")
    assert target / 2 <= rate <= 2 * target


def test_bucketed_filters_are_independent_and_droppable() -> None:
    bloom = BucketedBloom(1000, 0.001)
    bloom.add([(1, b"a"), (2, b"b")])
    assert bloom.maybe_contains([(1, b"a"), (2, b"b"), (1, b"b"), (3, b"a")]) == [
        True,
        True,
        False,
        False,
    ]
    bloom.drop_below(2)
    assert bloom.maybe_contains([(1, b"a"), (2, b"b")]) == [False, True]


def test_a_filter_over_fingerprints_reads_its_probes_from_them_at_the_target_rate() -> None:
    """The catalog's filters take 12-byte fingerprints (uniform hashes already) and read their
    probes from the bytes instead of hashing each id again: still no false negative, and the
    same false-positive rate as hashed ids."""
    target = 0.001
    bloom = BloomFilter(200_000, target, hashed=True)
    members = [fingerprint(f"member-{i}".encode())[0] for i in range(200_000)]
    bloom.add_many(members)
    assert all(bloom.contains_many(members)), "a Bloom filter must never give a false negative"
    probes = [fingerprint(f"stranger-{i}".encode())[0] for i in range(1_000_000)]
    rate = sum(bloom.contains_many(probes)) / len(probes)
    print(f"measured false-positive rate {rate:.5f} (target {target})")
    assert target / 2 <= rate <= 2 * target


def test_a_filter_over_fingerprints_refuses_other_ids() -> None:
    bloom = BloomFilter(1000, 0.01, hashed=True)
    with pytest.raises(ValueError, match="12-byte fingerprints"):
        bloom.add_many([b"member-1"])
