"""Photon's IdRegistry (seed 004): which joiner output a primary event, shared by pipelines.

At most one joined output per primary event at every moment: a joiner outputs an event only
after inserting its id here, and the first insert wins. An insert carries a token (the joiner's
`app|computation|shard|production id`, fixed when the production was checkpointed), so a joiner
that retries after a lost reply finds its own entry ("ours") and delivers, while every other
joiner finds "theirs" and counts a lost race. Only the holder's token releases an entry (the
verifier's recovery of an orphan).

Layout, outside every application's key space: one hash per (registry shard, event day),
`ms:{reg.<name>:<shard>}:d:<day>`, id -> "<token>|<insert ms>", expiring as a whole
`retention_days` after its day ends. The registry shard is mmh3(id) mod the shard count in
force for the event's day (`RegistryLayout`, versioned by day, so every pipeline agrees while
the registry is resharded for days to come). One Lua call per touched bucket, all in one
pipeline: round trips do not grow with the number of ids, on a single Redis or a Cluster.

Redis is not Paxos: a primary with AOF `fsync always` survives its own crash, but a failover to
a replica can lose acknowledged inserts, after which an event could be output twice; the
verifier reports such duplicates (docs/design.md section 11).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import mmh3

from millstream.state.client import RedisClient

DAY_MS = 86_400_000

# KEYS[1] the bucket; ARGV expire-at (s), now (ms), then id, token pairs. Per id: 1 inserted,
# 2 already ours, 3 someone else's; each followed by the holder's token.
_INSERT = """
local out = {}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', KEYS[1], id)
  if not held then
    redis.call('HSET', KEYS[1], id, token .. '|' .. ARGV[2])
    out[#out + 1] = 1
    out[#out + 1] = token
  else
    local holder = string.match(held, '^(.*)|[^|]*$')
    out[#out + 1] = (holder == token) and 2 or 3
    out[#out + 1] = holder
  end
end
redis.call('EXPIREAT', KEYS[1], ARGV[1])
return out
"""

# KEYS[1] the bucket; ARGV id, token pairs. Per id: 1 released, 0 not held with that token.
_RELEASE = """
local out = {}
for i = 1, #ARGV, 2 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held and string.match(held, '^(.*)|[^|]*$') == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""


class Outcome(StrEnum):
    INSERTED = "inserted"  # this token holds the id now: output it
    OURS = "ours"  # this token held it already (a retried insert): output it
    THEIRS = "theirs"  # another token holds it: a lost race, never output


_OUTCOMES = {1: Outcome.INSERTED, 2: Outcome.OURS, 3: Outcome.THEIRS}


@dataclass(frozen=True, slots=True)
class RegistryLayout:
    """Registry shard counts by the first event day (days since the epoch, UTC) they apply to.

    Resharding adds a version for a day to come; days already registered keep their count, so
    an id's bucket never moves."""

    versions: tuple[tuple[int, int], ...] = ((0, 16),)

    def __post_init__(self) -> None:
        days = [day for day, _ in self.versions]
        if not self.versions or days != sorted(set(days)):
            raise ValueError(f"layout versions must be by increasing first day: {self.versions}")
        if any(shards < 1 for _, shards in self.versions):
            raise ValueError(f"a layout version needs at least one shard: {self.versions}")

    def shards(self, day: int) -> int:
        count = self.versions[0][1]
        for first, shards in self.versions:
            if first <= day:
                count = shards
        return count


@dataclass(frozen=True, slots=True)
class Claim:
    """A primary event's id, its event time (which day holds it) and the claiming token."""

    id: str
    event_ms: int
    token: str


@dataclass(frozen=True, slots=True)
class Answer:
    outcome: Outcome
    holder: str  # the token holding the id after the insert


class IdRegistry:
    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        layout: RegistryLayout | None = None,
        retention_days: int = 7,
    ) -> None:
        if not name or any(c in name for c in "{}:"):
            raise ValueError(f"registry name {name!r}: non-empty, without '{{', '}}' or ':'")
        if retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, got {retention_days}")
        self.client = client
        self.name = name
        self.layout = layout or RegistryLayout()
        self.retention_days = retention_days
        # Counted so callers can show the cost is per batch, not per id: Redis round trips
        # made, and the scripts they carried (one per registry bucket a batch touched).
        self.round_trips = 0
        self.commands = 0

    def bucket(self, id: str, event_ms: int) -> str:
        day = event_ms // DAY_MS
        shard = mmh3.hash(id, 0x1D5E9, signed=False) % self.layout.shards(day)
        return f"ms:{{reg.{self.name}:{shard}}}:d:{day}"

    def expire_at(self, event_ms: int) -> int:
        """Unix seconds at which the bucket holding `event_ms` expires."""
        return (event_ms // DAY_MS + 1 + self.retention_days) * DAY_MS // 1000

    def _by_bucket(self, items: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for index, (id, event_ms) in enumerate(items):
            out.setdefault(self.bucket(id, event_ms), []).append(index)
        return out

    def insert(self, claims: Sequence[Claim], now_ms: int | None = None) -> list[Answer]:
        """Insert-if-absent each claim's id with its token, in claim order; one round trip."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        expired = [c.id for c in claims if self.expire_at(c.event_ms) * 1000 <= now]
        if expired:
            # Its day's bucket is gone (or goes at once): an insert would hold nothing, and the
            # event could be output again. Such events are past the registry's guarantee.
            raise ValueError(
                f"{len(expired)} event(s) older than the registry's {self.retention_days}-day "
                f"retention, e.g. {expired[0]!r}: they cannot be registered"
            )
        groups = self._by_bucket([(c.id, c.event_ms) for c in claims])
        pipe = self.client.pipeline(transaction=False)
        for key, indexes in groups.items():
            args: list[Any] = [self.expire_at(claims[indexes[0]].event_ms), now]
            for i in indexes:
                args += [claims[i].id, claims[i].token]
            pipe.execute_command("EVAL", _INSERT, 1, key, *args)  # Cluster pipelines too
        answers: list[Answer | None] = [None] * len(claims)
        replies = pipe.execute()
        self.round_trips += 1
        self.commands += len(groups)
        for indexes, reply in zip(groups.values(), replies, strict=True):
            for n, i in enumerate(indexes):
                holder = reply[2 * n + 1]
                answers[i] = Answer(
                    _OUTCOMES[int(reply[2 * n])],
                    holder.decode() if isinstance(holder, bytes) else str(holder),
                )
        return [a for a in answers if a is not None]

    def release(self, claims: Sequence[Claim]) -> list[bool]:
        """Delete each id held by the claim's token (an orphan's recovery); others stay."""
        groups = self._by_bucket([(c.id, c.event_ms) for c in claims])
        pipe = self.client.pipeline(transaction=False)
        for key, indexes in groups.items():
            args = [x for i in indexes for x in (claims[i].id, claims[i].token)]
            pipe.execute_command("EVAL", _RELEASE, 1, key, *args)
        released = [False] * len(claims)
        for indexes, reply in zip(groups.values(), pipe.execute(), strict=True):
            for n, i in enumerate(indexes):
                released[i] = int(reply[n]) == 1
        return released

    def holders(self, items: Sequence[tuple[str, int]]) -> list[str | None]:
        """The token holding each (id, event time), None where no one does."""
        groups = self._by_bucket(items)
        pipe = self.client.pipeline(transaction=False)
        for key, indexes in groups.items():
            pipe.hmget(key, [items[i][0] for i in indexes])
        out: list[str | None] = [None] * len(items)
        for indexes, reply in zip(groups.values(), pipe.execute(), strict=True):
            for i, held in zip(indexes, reply, strict=True):
                if held is not None:
                    text = held.decode() if isinstance(held, bytes) else str(held)
                    out[i] = text.rsplit("|", 1)[0]
        return out
