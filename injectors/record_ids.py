"""The ids the Kafka injector gives records without one of their own: their position.

A derived id is `blake2b-32(topic) | partition (4 bytes) | offset (8 bytes)`, big-endian: stable
across every redelivery of the record, and telling its position back. The runtime relies on
that second property: records whose ids are their position are deduplicated by offset marks
per partition (`state/offset_marks.py`) rather than one catalog entry each.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=65_536)
def id_prefix(topic: str, partition: int) -> bytes:
    """The first 8 bytes of every derived id of one partition: topic hash + partition."""
    return hashlib.blake2b(topic.encode(), digest_size=4).digest() + partition.to_bytes(4, "big")


def derived_id(topic: str, partition: int, offset: int) -> bytes:
    """A record's id when no header or extractor names one: 16 bytes, stable across every
    redelivery: blake2b-32(topic) | partition (4 bytes) | offset (8 bytes), big-endian.

    Recreating a topic restarts its offsets and so reuses ids: give such a topic a new name.
    """
    return id_prefix(topic, partition) + offset.to_bytes(8, "big")


def partition_prefix(topic: Any, partition: Any) -> bytes | None:
    """`id_prefix` of a row's source and partition, None if they are not a Kafka topic's."""
    if not isinstance(topic, str) or not isinstance(partition, int) or not 0 <= partition < 2**32:
        return None
    return id_prefix(topic, partition)


def is_position(rid: bytes, prefix: bytes, offset: Any) -> bool:
    """Whether `rid` is the derived id of the record at `offset` of the partition of `prefix`:
    the position it was read from (else an id of its own, or another source's)."""
    return (
        len(rid) == 16
        and rid[:8] == prefix
        and isinstance(offset, int)
        and 0 <= offset < 2**63
        and rid[8:] == offset.to_bytes(8, "big")
    )
