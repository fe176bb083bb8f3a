"""Replayed dead letters into a running application's batches (`state/replay.py`).

At the start of a batch the driver takes the queued entries for its computations; each
computation routes its own among its input rows, as rows of the stream the letter came from,
so only the computation that dead-lettered a record applies it again. After the batch has
committed and settled, the entries are removed. A crash in between leaves them queued: the
next batch reads them again from the same position and the catalog drops them as a replay.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from millstream.fault_points import fault_point
from millstream.headers import RESERVED_PREFIX
from millstream.state import replay
from millstream.state.client import RedisClient

log = logging.getLogger(__name__)


@dataclass
class ReplayIntake:
    """The queued replays one fused query takes, a batch at a time."""

    client: RedisClient
    app: str
    computations: tuple[str, ...]
    per_batch: int
    taken: list[str] = field(default_factory=list)

    def take(self) -> dict[str, list[tuple[str, replay.Replay]]]:
        """This batch's entries per computation (one XRANGE; nothing queued is the usual case)."""
        entries = replay.read_queue(self.client, self.app, self.computations, self.per_batch)
        self.taken = [entry for entry, _ in entries]
        by_computation: dict[str, list[tuple[str, replay.Replay]]] = {}
        for entry, item in entries:
            by_computation.setdefault(item.computation, []).append((entry, item))
        if entries:
            log.info("batch takes %d replayed dead letters", len(entries))
        return by_computation

    def settled(self) -> None:
        """The batch committed and settled: its entries leave the queue."""
        if self.taken:
            fault_point("before_replays_removed")  # applied, still queued
            replay.remove(self.client, self.app, self.taken)
            self.taken = []


def replay_rows(
    entries: list[tuple[str, replay.Replay]],
    now: int,
    floor: int,
    streams: Collection[str],
    computation: str,
) -> list[tuple]:
    """Rows in the injected schema's order for one computation's replays.

    A letter replayed without its event time (`--restamp`) is stamped when applied, never
    behind `floor` (the computation's input watermark), so it is on time. The system time is
    the batch's: the catalog looks for an id in every live bucket, so a re-read after a crash
    is still found. Headers named `ms-` are not carried: on an internal stream they would
    give the record the original production's id, which the catalog already holds. A letter
    of a stream the computation no longer reads (`streams`) is an error row: a dead letter
    again, saying so.
    """
    rows = []
    for entry, item in entries:
        stamp = item.timestamp if item.timestamp is not None else max(now, floor)
        headers = [(n, v) for n, v in item.headers if not n.startswith(RESERVED_PREFIX)]
        rows.append(
            (
                item.stream,
                item.id,
                item.key,
                item.value,
                stamp,
                now,
                replay.SOURCE,
                0,
                replay.entry_offset(entry),
                headers,
                None
                if item.stream in streams
                else f"replayed dead letter of stream {item.stream!r}, which {computation!r} "
                "no longer reads",
            )
        )
    return rows
