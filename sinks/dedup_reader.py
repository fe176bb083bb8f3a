"""Consumer-side deduplication for topics written at-least-once (`KafkaIdempotentSink`).

Each record carries its production id in the `ms-id` header; a re-delivery repeats the id.
Duplicates arrive close together (a re-delivery re-sends the productions of one shard that were
pending when a delivery failed), so remembering a bounded window of recent ids is enough:

- `DedupReader`: in memory, the last `max_ids` ids (FIFO). One reader process.
- `RedisDedupReader`: ids in Redis with a time-to-live, shared by reader processes and
  surviving their restarts; check with `filter()`, then `mark()` once the records are processed,
  so a crash between the two re-processes rather than loses records.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from millstream.errors import ConfigurationError
from millstream.headers import HEADER_ID

M = TypeVar("M")


def message_id(message: Any) -> bytes | None:
    """The `ms-id` header of a confluent-kafka Message, a kafka-python record, or a
    `millstream.testing.committed_reader.CommittedRecord`; None when absent."""
    headers = message.headers
    if callable(headers):
        headers = headers()
    for name, value in headers or ():
        if name == HEADER_ID:
            return bytes(value) if value is not None else None
    return None


class DedupReader:
    """Drops records whose `ms-id` is among the last `max_ids` ids seen; memory is bounded.

    Size `max_ids` above the number of records that can lie between a record and its duplicate:
    at least (productions per batch per shard) x (shards writing the topic).
    Records without an `ms-id` header pass through.
    """

    def __init__(self, max_ids: int = 1_000_000) -> None:
        if max_ids < 1:
            raise ConfigurationError(f"max_ids={max_ids} must be at least 1")
        self._max = max_ids
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.duplicates = 0

    def first_time(self, record_id: bytes) -> bool:
        """True the first time an id is offered (within the window); remembers it."""
        if record_id in self._seen:
            self._seen.move_to_end(record_id)
            self.duplicates += 1
            return False
        self._seen[record_id] = None
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return True

    def filter(self, messages: Iterable[M]) -> Iterator[M]:
        """Yield each message unless its id was seen before."""
        for message in messages:
            rid = message_id(message)
            if rid is None or self.first_time(rid):
                yield message

    def __len__(self) -> int:
        return len(self._seen)


class RedisDedupReader:
    """Seen ids in Redis (`{namespace}:{id hex}`, expiring after `ttl_s`), one round trip per call.

    `filter()` only reads; call `mark()` after processing so that a reader crash in between
    re-processes those records instead of losing them.
    """

    def __init__(self, client: Any, namespace: str, ttl_s: int = 24 * 3600) -> None:
        if ttl_s < 1:
            raise ConfigurationError(f"ttl_s={ttl_s} must be at least 1 second")
        self._client = client
        self._namespace = namespace
        self._ttl_ms = int(ttl_s * 1000)

    def _key(self, record_id: bytes) -> str:
        return f"{self._namespace}:{record_id.hex()}"

    def filter(self, messages: Sequence[M]) -> list[M]:
        """Messages whose id is neither marked in Redis nor repeated earlier in this batch."""
        ids = [message_id(m) for m in messages]
        known = [i for i in ids if i is not None]
        pipe = self._client.pipeline(transaction=False)
        for known_id in known:
            pipe.exists(self._key(known_id))
        seen = {k for k, hit in zip(known, pipe.execute(), strict=True) if hit}
        out: list[M] = []
        for message, rid in zip(messages, ids, strict=True):
            if rid is None:
                out.append(message)
            elif rid not in seen:
                seen.add(rid)
                out.append(message)
        return out

    def mark(self, messages: Iterable[Any]) -> None:
        """Remember these ids as processed (for `ttl_s`)."""
        pipe = self._client.pipeline(transaction=False)
        for message in messages:
            rid = message_id(message)
            if rid is not None:
                pipe.set(self._key(rid), b"1", px=self._ttl_ms)
        pipe.execute()
