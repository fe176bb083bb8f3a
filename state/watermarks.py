"""The low-watermark authority (MillWheel section 5.2 / 7.2, docs/design.md section 8).

A watermark is a pair: event time drives timers and windows; system time drives catalog
garbage collection. Both are published monotonically: a published value never decreases.
Injector instances publish their estimates; a computation's watermark is
min(oldest work of its shards, watermarks of its input streams, records in flight in topics).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from millstream.state.keys import app_key

if TYPE_CHECKING:
    from millstream.state.client import RedisClient

# Held when nothing is known yet (no injector has reported): nothing may fire.
UNKNOWN = -(2**62)
INFINITY = 2**62


@dataclass(frozen=True, slots=True)
class Watermark:
    event: int
    system: int

    def encode(self) -> bytes:
        return f"{self.event},{self.system}".encode()

    @classmethod
    def decode(cls, raw: bytes | str | None) -> Watermark | None:
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        event, system = text.split(",")
        return cls(int(event), int(system))

    def min(self, other: Watermark) -> Watermark:
        return Watermark(min(self.event, other.event), min(self.system, other.system))

    def max(self, other: Watermark) -> Watermark:
        return Watermark(max(self.event, other.event), max(self.system, other.system))


NONE_KNOWN = Watermark(UNKNOWN, UNKNOWN)
NO_WORK = Watermark(INFINITY, INFINITY)


def merge_min(values: Iterable[Watermark]) -> Watermark:
    out = NO_WORK
    for value in values:
        out = out.min(value)
    return out


class WatermarkAuthority:
    """Central authority in Redis for one application."""

    # KEYS[1]: hash; ARGV[1]: field; ARGV[2]: event ms; ARGV[3]: system ms.
    # Raises the stored pair component-wise (never lowers it); returns the stored "event,system".
    RAISE_SCRIPT = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local e, s = tonumber(ARGV[2]), tonumber(ARGV[3])
if cur then
  local ce, cs = string.match(cur, '^(-?%d+),(-?%d+)$')
  ce, cs = tonumber(ce), tonumber(cs)
  if ce > e then e = ce end
  if cs > s then s = cs end
end
local out = string.format('%d,%d', e, s)
redis.call('HSET', KEYS[1], ARGV[1], out)
return out
"""

    def __init__(self, client: RedisClient, app: str) -> None:
        self._client = client
        self._app = app
        self._raise = client.register_script(self.RAISE_SCRIPT)

    # --- keys -------------------------------------------------------------------------------
    def _injectors_key(self, stream: str) -> str:
        return app_key(self._app, "inj", stream)

    def _declared_key(self, stream: str) -> str:
        return app_key(self._app, "injset", stream)

    @property
    def _published_key(self) -> str:
        return app_key(self._app, "wm")

    def _inflight_key(self, stream: str, partition: int) -> str:
        return app_key(self._app, "inflight", stream, str(partition))

    # --- injectors --------------------------------------------------------------------------
    def declare_injectors(self, stream: str, instances: Sequence[str]) -> None:
        """Declare the expected injector instances of a stream: a missing one holds the watermark."""
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self._declared_key(stream))
        if instances:
            pipe.sadd(self._declared_key(stream), *instances)
        pipe.execute()

    def publish_injector(self, stream: str, instance: str, value: Watermark) -> Watermark:
        """Raise one injector instance's estimate; returns the (monotonic) stored value."""
        raw = self._raise(
            keys=[self._injectors_key(stream)], args=[instance, value.event, value.system]
        )
        result = Watermark.decode(raw)
        assert result is not None
        return result

    def injector_stream(self, stream: str) -> Watermark:
        """min over declared instances; an instance that never reported holds it at NONE_KNOWN."""
        pipe = self._client.pipeline(transaction=False)
        pipe.smembers(self._declared_key(stream))
        pipe.hgetall(self._injectors_key(stream))
        declared_raw, reported_raw = pipe.execute()
        reported = {k.decode(): Watermark.decode(v) for k, v in reported_raw.items()}
        declared = {d.decode() for d in declared_raw} or set(reported)
        if not declared:
            return NONE_KNOWN
        return merge_min(reported.get(name) or NONE_KNOWN for name in declared)

    def injector_watermark(self, stream: str, instances: Sequence[str]) -> Watermark:
        """min over the given injector instances of a stream; one never reported holds it."""
        raw = self._client.hmget(self._injectors_key(stream), list(instances))
        return merge_min(Watermark.decode(r) or NONE_KNOWN for r in raw)

    # --- computations -----------------------------------------------------------------------
    def published(self, name: str) -> Watermark | None:
        """The last published watermark of a computation or stream, or None if never published."""
        return Watermark.decode(self._client.hget(self._published_key, name))

    def publish(self, name: str, value: Watermark) -> Watermark:
        """Publish monotonically: the stored value only rises; returns it."""
        result = Watermark.decode(
            self._raise(keys=[self._published_key], args=[name, value.event, value.system])
        )
        assert result is not None
        return result

    # --- records in flight in topics --------------------------------------------------------
    def add_in_flight(
        self, stream: str, entries: Iterable[tuple[int, int, Watermark]], token: str
    ) -> None:
        """Record delivered batches: (partition, max offset, min (event, system) of the batch).

        Until a consumer commits past max offset, those records hold its input watermark.
        """
        pipe = self._client.pipeline(transaction=False)
        for partition, max_offset, wm in entries:
            member = f"{max_offset}:{wm.event}:{wm.system}:{token}"
            pipe.zadd(self._inflight_key(stream, partition), {member: max_offset})
        pipe.execute()

    def in_flight(self, stream: str, partitions: int, committed: dict[int, int]) -> Watermark:
        """Min watermark of delivered records at or beyond the consumer's committed offsets."""
        pipe = self._client.pipeline(transaction=False)
        for partition in range(partitions):
            offset = committed.get(partition, 0)
            pipe.zrangebyscore(self._inflight_key(stream, partition), offset, "+inf")
        out = NO_WORK
        for members in pipe.execute():
            for member in members:
                _, event, system, _ = member.decode().split(":", 3)
                out = out.min(Watermark(int(event), int(system)))
        return out

    def retire_in_flight(self, stream: str, committed: dict[int, int]) -> None:
        """Drop in-flight entries wholly below the committed offsets (single-consumer streams)."""
        pipe = self._client.pipeline(transaction=False)
        for partition, offset in committed.items():
            pipe.zremrangebyscore(self._inflight_key(stream, partition), "-inf", offset - 1)
        pipe.execute()


def percentile_watermark(values: Sequence[int], fraction: float) -> int:
    """A percentile low watermark: `fraction` of pending work is at or after the returned time.

    MillWheel offers these to consumers that prefer speed to completeness.
    """
    if not values:
        return INFINITY
    ordered = sorted(values)
    index = max(0, math.ceil(round((1.0 - fraction) * len(ordered), 9)) - 1)
    return ordered[index]


def now_ms() -> int:
    return time.time_ns() // 1_000_000
