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
    avro_format,
    json_format,
    kafka_source,
)
from millstream.connectors.plan import TaskInput
from millstream.connectors.shard_jobs import task_payload as _task_payload


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


def test_rows_travel_as_plain_tuples_and_only_avro_decoded_values_with_them() -> None:
    topology = Topology("payload")
    topology.source("js", kafka_source("a"))
    topology.source("pts", kafka_source("b"))
    topology.source("av", kafka_source("c"))
    topology.stream_format("js", json_format())
    topology.stream_format("pts", PointFormat())
    schema = {"type": "record", "name": "A", "fields": [{"name": "a", "type": "int"}]}
    topology.stream_format("av", avro_format(schema))
    topology.computation("c", Nothing(), inputs=["js", "pts", "av"], shards=2)
    spec = topology.computations["c"]
    items = [
        TaskInput("k", _row("js", b'{"a": 1}'), None, {"a": 1}, decoded=True),
        TaskInput("k", _row("pts", b"3"), None, Point(3), decoded=True),
        TaskInput(None, _row("js", b"{"), "bad json", None, decoded=False),
        TaskInput("k", _row("av", b"\x02"), None, {"a": 1}, decoded=True),
    ]
    [(shard, sent)] = pickle.loads(_task_payload(spec, [(1, items)]))
    assert shard == 1
    rebuilt = [TaskInput(*t) for t in sent]
    # JSON is decoded again in the task: cheaper than pickling the decoded value
    assert rebuilt[0] == TaskInput("k", items[0].row, None, None, decoded=False)
    # a user's format may decode into classes only the driver's script has: decoded again
    assert rebuilt[1] == TaskInput("k", items[1].row, None, None, decoded=False)
    assert rebuilt[2] == items[2]
    assert rebuilt[3] == items[3]  # Avro decodes into builtins and costs more to decode again


def test_shards_are_grouped_into_tasks_of_about_equal_rows() -> None:
    from millstream.connectors.shard_jobs import balanced_groups

    rows = {0: 2220, 1: 2876, 2: 1078, 3: 2058, 4: 5969, 5: 1856, 6: 2320, 7: 1623}
    groups = balanced_groups(list(rows), rows, 2)
    assert sorted(s for g in groups for s in g) == list(rows)  # every shard, once
    loads = [sum(rows[s] for s in g) for g in groups]
    assert max(loads) - min(loads) <= max(rows.values()) // 4  # mod-2 grouping: 11,587 / 8,413
    assert balanced_groups([3, 5], {}, 4) == [[3], [5]]  # no more groups than shards
    assert balanced_groups([], {}, 2) == [[]]
