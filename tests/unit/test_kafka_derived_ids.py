"""The Kafka reader's ids of records without one of their own are `derived_id`'s: checked on the
reader's own code paths (one record at a time, the driver's rows, the Arrow batch), not on a copy
of the formula."""

from __future__ import annotations

from millstream.injectors import _kafka_rows
from millstream.injectors.record_ids import derived_id
from millstream.injectors.schema import INJECTED_SCHEMA

ID = INJECTED_SCHEMA.fieldNames().index("id")
OFFSETS = [0, 1, 17, 2**40 + 3]


class Message:
    """The three fields of a confluent-kafka Message the id is made of."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._where = (topic, partition, offset)

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]


def _columns() -> _kafka_rows.Columns:
    cols = _kafka_rows.Columns()
    for offset in OFFSETS:
        cols.offsets.append(offset)
        cols.keys.append(b"k")
        cols.values.append(b"v")
        cols.event.append(1)
        cols.system.append(1)
        cols.header_ends.append(0)
    return cols


def test_every_reader_path_gives_derived_id() -> None:
    expected = [derived_id("orders", 3, offset) for offset in OFFSETS]
    assert [_kafka_rows._derived_id(Message("orders", 3, o)) for o in OFFSETS] == expected
    rows = _kafka_rows.to_rows(_columns(), "s", "orders", 3)
    assert [row[ID] for row in rows] == expected
    batch = _kafka_rows.to_batch(_columns(), "s", "orders", 3)
    assert batch.column("id").to_pylist() == expected
