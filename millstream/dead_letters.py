"""`millstream dead-letters`: read an application's dead letters, and replay them after a fix.

Dead letters are the JSON bodies the runtime writes to the Kafka topic `<app>.dead-letters`
(`connectors/key_runner.dead_letter`), each with its production id in the `ms-id` header. The
topic is written at least once (a redelivery after a crash repeats a letter with the same id),
so letters are told apart by that id here.

A replay queues each chosen letter's record for the computation that dead-lettered it
(`state/replay.py`, which says why that is exactly once): the record the injector read (key,
value and headers, given exactly in the letter), under the stream it came from, with its event
time or (`restamp`) the time it is applied.
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from millstream.errors import ConfigurationError
from millstream.state import replay
from millstream.state.client import RedisClient
from millstream.topic_reader import read_to_end


@dataclass(frozen=True)
class Letter:
    """One dead letter: its id, where it sits in the topic, and its body."""

    id: bytes
    partition: int
    offset: int
    body: dict[str, Any]

    @property
    def computation(self) -> str:
        return str(self.body.get("computation", "?"))

    @property
    def reason(self) -> str:
        return str(self.body.get("error", "?"))

    @property
    def key(self) -> str:
        return str(self.body.get("key", ""))

    @property
    def timestamp(self) -> int | None:
        ts = self.body.get("timestamp")
        return ts if isinstance(ts, int) else None

    def not_replayable(self) -> str | None:
        """Why this letter cannot be replayed, or None."""
        body = self.body
        if "timer" in body:
            return "a timer's failure, not a record's (the timer is gone; nothing to re-inject)"
        if "stream" not in body or "value" not in body:
            return "it names no record (no stream or value)"
        if body.get("value_truncated"):
            return (
                f"its value is {body.get('value_bytes')} bytes and the letter holds the first "
                "16 KiB only; re-send the record from its source"
            )
        return None

    def to_replay(self, restamp: bool) -> replay.Replay:
        body = self.body
        return replay.Replay(
            letter=self.id,
            computation=self.computation,
            stream=str(body["stream"]),
            key=_bytes_of(body, "record_key"),
            value=_bytes_of(body, "value") or b"",
            timestamp=None if restamp else self.timestamp,
            headers=tuple((str(n), base64.b64decode(v)) for n, v in body.get("headers_base64", ())),
        )

    def summary(self) -> dict[str, Any]:
        body = self.body
        return {
            "id": self.id.hex(),
            "computation": self.computation,
            "key": self.key,
            "reason": self.reason,
            "timestamp": self.timestamp,
            "stream": body.get("stream"),
            "position": None
            if "stream" not in body
            else f"{body.get('source')} partition {body.get('partition')} offset {body.get('offset')}",
            "value": body.get("value"),
            "replayable": self.not_replayable() is None,
        }


def _bytes_of(body: Mapping[str, Any], name: str) -> bytes | None:
    """A bytes field as `key_runner._bytes_field` wrote it."""
    if f"{name}_base64" in body:
        return base64.b64decode(body[f"{name}_base64"])
    value = body.get(name)
    return None if value is None else str(value).encode("utf-8")


def read_letters(
    kafka: Mapping[str, str], topic: str, progress: Callable[[int], None] | None = None
) -> list[Letter]:
    """Every letter in `topic` as a read_committed reader sees it, once per id, oldest first
    per partition."""
    letters: dict[bytes, Letter] = {}
    missing = (
        ": the application has written no dead letter yet, or the app name (or --topic) is wrong"
    )
    for message in read_to_end(kafka, topic, missing=missing, progress=progress):
        letter = _letter(message)
        letters.setdefault(letter.id, letter)
    return sorted(letters.values(), key=lambda x: (x.partition, x.offset))


def _letter(message: Any) -> Letter:
    rid = next((v for n, v in message.headers() or () if n == "ms-id"), None)
    raw = message.value() or b""
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("not an object")
    except ValueError:
        body = {"error": "?", "unreadable_letter": raw[:200].decode("utf-8", "backslashreplace")}
    if rid is None:  # not written by millstream's sink: its position names it
        rid = f"{message.topic()}:{message.partition()}:{message.offset()}".encode()
    return Letter(rid, message.partition(), message.offset(), body)


def choose(
    letters: Iterable[Letter], computation: str | None = None, reason: str | None = None
) -> list[Letter]:
    """The letters of `computation` whose reason contains `reason` (either may be None)."""
    return [
        letter
        for letter in letters
        if (computation is None or letter.computation == computation)
        and (reason is None or reason in letter.reason)
    ]


@dataclass
class ReplayReport:
    """What a replay did, letter by letter."""

    queued: int = 0
    already_replayed: int = 0
    not_replayable: Counter[str] = field(default_factory=Counter)
    waiting_in_queue: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "already_replayed": self.already_replayed,
            "not_replayable": dict(self.not_replayable),
            "waiting_in_queue": self.waiting_in_queue,
        }


def replay_letters(
    client: RedisClient,
    app: str,
    letters: list[Letter],
    restamp: bool,
    known: Iterable[str],
) -> ReplayReport:
    """Queue the replayable letters of computations the application has (`known`)."""
    names = set(known)
    unknown = sorted({x.computation for x in letters} - names)
    if unknown:
        raise ConfigurationError(
            f"app {app!r} has no computation {unknown} in Redis (it has {sorted(names)}): a "
            "renamed or removed computation cannot take its letters back; pick with --computation"
        )
    report = ReplayReport()
    ready = []
    for letter in letters:
        why = letter.not_replayable()
        if why is None:
            ready.append(letter.to_replay(restamp))
        else:
            report.not_replayable[why] += 1
    done = replay.enqueue(client, app, ready)
    report.queued, report.already_replayed = done.queued, done.already
    report.waiting_in_queue = replay.queued(client, app)
    return report


def render(letters: list[Letter], limit: int) -> str:
    """The listing a person reads: counts per computation and reason, then the letters."""
    if not letters:
        return "no dead letters"
    counts = Counter((x.computation, x.reason) for x in letters)
    lines = [f"{len(letters)} dead letters"]
    for (computation, reason), n in counts.most_common():
        lines.append(f"  {n:>7}  {computation}: {reason}")
    shown = letters[-limit:] if limit else []
    if shown:
        lines.append(f"the last {len(shown)}:" if len(shown) < len(letters) else "all:")
    for letter in shown:
        row = letter.summary()
        stamp = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["timestamp"] / 1000))
            if row["timestamp"] is not None
            else "-"
        )
        where = f" from {row['stream']} at {row['position']}" if row["position"] else ""
        value = (row["value"] or "")[:80]
        lines.append(
            f"  {stamp} {row['computation']} key {row['key']!r}{where}: {row['reason']}"
            + (f"\n      value {value!r}" if value else "")
            + ("" if row["replayable"] else "\n      (not replayable)")
        )
    return "\n".join(lines)
