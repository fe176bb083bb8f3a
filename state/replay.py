"""Dead letters replayed: records queued for one computation each, applied exactly once.

`millstream dead-letters APP --replay` writes here; the driver of a running application reads
the queue at every batch and hands each entry to its computation only (a record another
computation applied is not applied there again). Why it is exactly once:

- A replayed letter becomes a record whose id is derived from the letter's own id
  (`replay_id`): replaying the same letter again gives the same record, which the
  computation's catalog drops like any duplicate.
- Letters enter the queue a chunk at a time, each chunk in one MULTI/EXEC with a mark per
  letter (`replayed`, kept until the application is reset): a replay killed midway is run
  again and queues only the letters it had not marked, however long after.
- The driver deletes entries only after the batch that applied them committed and settled.
  A batch re-run after a crash reads them again from the same position (the entry id), and
  the catalog tells that apart as a replay of the batch.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from millstream.fault_points import fault_point
from millstream.state.client import RedisClient
from millstream.state.keys import app_key
from millstream.state.watermarks import now_ms

QUEUE = "replay"  # a Redis stream of entries, one per replayed letter
MARKS = "replayed"  # hash: letter id (hex) -> when it was queued (ms)
CHUNK = 500  # letters per MULTI/EXEC
SOURCE = "replay"  # a replayed record's position: source "replay", partition 0, the entry


def queue_key(app: str) -> str:
    return app_key(app, QUEUE)


def marks_key(app: str) -> str:
    return app_key(app, MARKS)


def replay_id(letter_id: bytes) -> bytes:
    """The record id of a replayed letter: stable, and unlike any id an injector gives."""
    return hashlib.blake2b(b"millstream-replay\x00" + letter_id, digest_size=16).digest()


@dataclass(frozen=True)
class Replay:
    """One dead letter's record, for its computation: the bytes the injector read, its event
    time (None: stamped with the time the runtime applies it) and its user headers."""

    letter: bytes
    computation: str
    stream: str
    key: bytes | None
    value: bytes
    timestamp: int | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def id(self) -> bytes:
        return replay_id(self.letter)

    def fields(self) -> dict[str, bytes]:
        out = {
            "letter": self.letter,
            "computation": self.computation.encode(),
            "stream": self.stream.encode(),
            "value": self.value,
            "timestamp": b"" if self.timestamp is None else str(self.timestamp).encode(),
            "headers": json.dumps(
                [[n, base64.b64encode(v).decode()] for n, v in self.headers]
            ).encode(),
        }
        if self.key is not None:
            out["key"] = self.key
        return out

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Replay:
        stamp = fields.get(b"timestamp", b"")
        return cls(
            letter=fields[b"letter"],
            computation=fields[b"computation"].decode(),
            stream=fields[b"stream"].decode(),
            key=fields.get(b"key"),
            value=fields.get(b"value", b""),
            timestamp=int(stamp) if stamp else None,
            headers=tuple(
                (n, base64.b64decode(v)) for n, v in json.loads(fields.get(b"headers", b"[]"))
            ),
        )


@dataclass
class Queued:
    """What one replay call did: letters queued now, and letters an earlier replay queued."""

    queued: int = 0
    already: int = 0


def enqueue(client: RedisClient, app: str, replays: Sequence[Replay]) -> Queued:
    """Queue the letters not replayed before; a chunk and its marks in one transaction.

    Two replays running at once may both queue a letter; the catalog still applies it once.
    """
    done = Queued()
    for start in range(0, len(replays), CHUNK):
        chunk = list({r.letter: r for r in replays[start : start + CHUNK]}.values())
        marked = client.hmget(marks_key(app), [r.letter.hex() for r in chunk])
        fresh = [r for r, mark in zip(chunk, marked, strict=True) if mark is None]
        done.already += len(chunk) - len(fresh)
        if not fresh:
            continue
        stamp = str(now_ms()).encode()
        pipe = client.pipeline(transaction=True)
        for replay in fresh:
            pipe.xadd(queue_key(app), cast(Any, replay.fields()))
        pipe.hset(marks_key(app), mapping={r.letter.hex(): stamp for r in fresh})
        pipe.execute()
        done.queued += len(fresh)
        fault_point("replay_chunk_queued")
    return done


def read_queue(
    client: RedisClient, app: str, computations: Iterable[str], count: int, page: int = 1000
) -> list[tuple[str, Replay]]:
    """Up to `count` queued entries for `computations`, oldest first: (entry id, replay).

    Read a page at a time: entries for other computations (another query's, or one no query
    runs any more) never hide later ones."""
    wanted = set(computations)
    out: list[tuple[str, Replay]] = []
    start = "-"
    while len(out) < count:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            client.xrange(queue_key(app), min=start, count=page),
        )
        for entry, fields in entries:
            replay = Replay.from_fields(fields)
            if replay.computation in wanted and len(out) < count:
                out.append((_text(entry), replay))
        if len(entries) < page:
            break
        start = "(" + _text(entries[-1][0])  # exclusive: after the last one read
    return out


def remove(client: RedisClient, app: str, entries: Sequence[str]) -> None:
    """Delete entries whose batch committed and settled."""
    if entries:
        client.xdel(queue_key(app), *entries)


def queued(client: RedisClient, app: str) -> int:
    return int(client.xlen(queue_key(app)))


def entry_offset(entry: str) -> int:
    """An entry id `ms-seq` as one number: the replayed record's offset in its position."""
    ms, _, seq = entry.partition("-")
    return int(ms) * 1_000_000 + int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
