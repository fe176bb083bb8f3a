"""What the fused runtime sends to a Spark shard task (pure; no Spark, no Redis)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from millstream import (
    Computation,
    Context,
    Record,
    Topology,
    ValueFormat,
    json_format,
    kafka_source,
)
from millstream.connectors.fused import _task_payload
from millstream.connectors.plan import TaskInput


@dataclass
class Point:
    x: int


class PointFormat(ValueFormat):
    """A user format decoding into a class of the user's own."""

    def decode(self, value: bytes) -> Any:
        return Point(int(value))

    def encode(self, data: Any) -> bytes:
        return str(data.x).encode()


class Nothing(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


def _row(stream: str, value: bytes) -> tuple:
    return (stream, b"id", b"k", value, 1, 1, "t", 0, 7, [("h", b"v")], None)


def test_rows_travel_as_plain_tuples_and_only_portable_decoded_values_with_them() -> None:
    topology = Topology("payload")
    topology.source("js", kafka_source("a"))
    topology.source("pts", kafka_source("b"))
    topology.stream_format("js", json_format())
    topology.stream_format("pts", PointFormat())
    topology.computation("c", Nothing(), inputs=["js", "pts"], shards=2)
    spec = topology.computations["c"]
    items = [
        TaskInput("k", _row("js", b'{"a": 1}'), None, {"a": 1}, decoded=True),
        TaskInput("k", _row("pts", b"3"), None, Point(3), decoded=True),
        TaskInput(None, _row("js", b"{"), "bad json", None, decoded=False),
    ]
    [(shard, sent)] = pickle.loads(_task_payload(spec, [(1, items)]))
    assert shard == 1
    rebuilt = [TaskInput(*t) for t in sent]
    assert rebuilt[0] == items[0]  # JSON decodes into builtins: the task need not decode again
    assert rebuilt[1] == TaskInput("k", items[1].row, None, None, decoded=False)  # decoded again
    assert rebuilt[2] == items[2]
