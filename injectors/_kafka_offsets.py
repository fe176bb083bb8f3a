"""The Kafka injector's Spark offset and admission control: pure code, no I/O (its record ids:
`record_ids.py`).

The offset is the whole resumable position (bytewax's snapshot, not state in the object):

    {"p": {"topic:partition": next_offset, ...}, "wm": [event_ms, system_ms], "tick": n}

`p` bounds what a batch reads, `wm` is the injector's watermark once the batch is processed
(published in `commit`), `tick` is the wall-clock tick that makes Spark run a batch, possibly
empty, at least once per tick so that watermarks advance and wall-time timers fire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from millstream.state.watermarks import Watermark

TopicPartition = tuple[str, int]


@dataclass
class KafkaRange(InputPartition):
    """One Spark task (or one of the driver's reads): offsets [start, end) of one Kafka
    partition."""

    topic: str
    partition: int
    start: int
    end: int


def tp_key(tp: TopicPartition) -> str:
    return f"{tp[0]}:{tp[1]}"


def parse_tp(key: str) -> TopicPartition:
    # Topic names cannot contain ':', so the last ':' separates the partition.
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


@dataclass(frozen=True)
class InjectorOffset:
    positions: Mapping[TopicPartition, int]
    watermark: Watermark
    tick: int

    def to_json(self) -> dict[str, Any]:
        """Sorted keys: the same position always serialises to the same JSON text."""
        return {
            "p": {tp_key(tp): self.positions[tp] for tp in sorted(self.positions)},
            "wm": [self.watermark.event, self.watermark.system],
            "tick": self.tick,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> InjectorOffset:
        try:
            positions = {parse_tp(k): int(v) for k, v in raw["p"].items()}
            event, system = raw["wm"]
            return cls(positions, Watermark(int(event), int(system)), int(raw["tick"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"not a millstream-kafka offset ({exc!r}): {dict(raw)!r}; was the checkpoint "
                "written by another source? Start the query from a new checkpoint folder."
            ) from None


def allocate(
    available: Mapping[TopicPartition, int], limit: int | None
) -> dict[TopicPartition, int]:
    """How many offsets each partition may advance this batch, at most `limit` in total.

    Max-min fair (water-filling): short backlogs drain completely, the rest share what is left
    evenly, so one hot partition cannot starve the others. Deterministic for equal inputs.
    """
    if limit is None:
        return {tp: max(0, n) for tp, n in available.items()}
    out = {tp: 0 for tp in available}
    pending = sorted((n, tp) for tp, n in available.items() if n > 0)
    budget = limit
    while pending and budget > 0:
        share = budget // len(pending)
        if share == 0:
            # Fewer offsets left than partitions: one each, in a fixed order.
            for _, tp in sorted(pending, key=lambda item: item[1])[:budget]:
                out[tp] += 1
            break
        step = min(share, pending[0][0])  # pending is sorted: the smallest backlog first
        taken = 0
        rest = []
        for n, tp in pending:
            out[tp] += step
            taken += step
            if n - step > 0:
                rest.append((n - step, tp))
        budget -= taken
        pending = rest
    return out
