"""Which fused query runs which computations, kept in Redis so a restart forms the same ones.

An application starts as one fused query. A computation added to a running application runs in
a query of its own, with its own injector positions and checkpoint, so the others keep theirs.
Restarting must form the same queries: merging them would hand the added computation the
others' positions (records between them would never reach it) and leave each query's Spark
checkpoint with another set of sources than it was written with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from millstream.state.client import RedisClient
from millstream.state.keys import app_key

MAIN = "main"


@dataclass(frozen=True)
class Segment:
    """A fused query: its name and computations, and the streams it reads (kept even when a
    computation that read them is removed: a Spark checkpoint pins the query's sources)."""

    name: str
    computations: tuple[str, ...]
    reads: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"computations": list(self.computations), "reads": list(self.reads)})

    @classmethod
    def from_json(cls, name: str, raw: str | bytes) -> Segment:
        data = json.loads(raw)
        return cls(name, tuple(data["computations"]), tuple(data.get("reads", ())))


def plan_segments(
    recorded: Mapping[str, Segment], wanted: Sequence[str], running: Iterable[str]
) -> list[Segment]:
    """The queries to start for `wanted` computations, of which `running` already run.

    A recorded query is formed again with those of its computations that are wanted; the rest
    form one new query: MAIN when nothing was ever recorded, else named after its first
    computation.
    """
    busy = set(running)
    out: list[Segment] = []
    placed: set[str] = set()
    for segment in recorded.values():
        members = tuple(c for c in segment.computations if c in wanted and c not in busy)
        placed.update(segment.computations)
        if members:
            out.append(Segment(segment.name, members, segment.reads))
    rest = tuple(c for c in wanted if c not in placed and c not in busy)
    if rest:
        name = MAIN if not recorded and not busy else rest[0]
        taken = set(recorded)
        suffix = 1
        base = name
        while name in taken:
            suffix += 1
            name = f"{base}-{suffix}"
        out.append(Segment(name, rest))
    return out


class SegmentLayout:
    """The recorded queries of one application (a Redis hash: query name -> JSON)."""

    def __init__(self, client: RedisClient, app: str) -> None:
        self._client = client
        self._key = app_key(app, "segments")

    def load(self) -> dict[str, Segment]:
        raw = self._client.hgetall(self._key)
        return {
            (k.decode() if isinstance(k, bytes) else k): Segment.from_json(
                k.decode() if isinstance(k, bytes) else k, v
            )
            for k, v in raw.items()
        }

    def save(self, segment: Segment) -> None:
        self._client.hset(self._key, segment.name, segment.to_json())

    def drop(self, name: str) -> None:
        self._client.hdel(self._key, name)
