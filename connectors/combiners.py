"""Aggregations for windows, as combiners (Beam's CombineFn shape).

A combiner folds values into an accumulator: `create()`, `add(acc, value)`, `merge(acc, acc)`,
`result(acc)`. Because `merge` exists, the runtime can fold a key's records of a batch into
one partial accumulator per window first and touch the stored accumulator once (combiner
lifting, Cloud Dataflow). Accumulators are stored with the computation's serde: the built-ins'
are JSON numbers and lists; a user combiner whose accumulator is not JSON declares
`serde="pickle"`.

`extract(record)` picks the value a record adds: the built-ins read `field` from the decoded
JSON value (or call it, when it is a function of the record); a record without a usable value
is a dead letter naming the field, never a silently skipped count.

`add_all(acc, values)` adds a window's values of a batch in order, as `add` one by one would:
the built-ins do it in one call, and those that read no more of a record than its value
(`from_value`, `reads_value`) are folded from the batch's rows without a `Record` built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from millstream.records import Record

FieldSpec = str | Callable[[Record], Any] | None


class Combiner:
    """A user aggregation: override `create`, `add`, `merge` and `result` (and `extract` to
    choose what a record contributes: by default its value decoded by the stream's format,
    or else parsed as JSON)."""

    # A built-in whose value comes from the record's value alone (`from_value`); a user
    # combiner's `extract` may read anything of the record.
    from_value = False
    reads_value = True  # False: the value added is always the same (a count)

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, acc: Any, other: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc

    def extract(self, record: Record) -> Any:
        return record.data if record.data is not None else json.loads(record.value)

    def add_all(self, acc: Any, values: Sequence[Any]) -> Any:
        """`add` of each value in turn."""
        add = self.add
        for value in values:
            acc = add(acc, value)
        return acc

    def value_of(self, data: Any, raw: bytes) -> Any:
        """What `extract` gives a record whose decoded value is `data` (None: undecoded) and
        raw value `raw`: only where `from_value`."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


class _FieldCombiner(Combiner):
    """A built-in reading a number from each record: `field` of its JSON object value, a
    function of the record, or (None) the value itself."""

    numeric = True

    def __init__(self, field: FieldSpec = None) -> None:
        if field is not None and not isinstance(field, str) and not callable(field):
            raise TypeError(f"field must be a name, a function of the record or None: {field!r}")
        self.field = field
        self.from_value = not callable(field)

    def extract(self, record: Record) -> Any:
        field = self.field
        if callable(field):
            return self._checked(field(record))
        return self.value_of(record.data, record.value)

    def value_of(self, data: Any, raw: bytes) -> Any:
        if data is None:
            data = json.loads(raw)
        field = self.field
        if field is None:
            return self._checked(data)
        if not isinstance(data, dict) or field not in data:
            raise ValueError(f"{self.describe()}: the record's value has no field {field!r}")
        return self._checked(data[field])

    def _checked(self, value: Any) -> Any:
        if self.numeric and (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or (isinstance(value, float) and not math.isfinite(value))
        ):
            raise ValueError(f"{self.describe()}: {value!r} is not a finite number")
        return value

    def describe(self) -> str:
        name = type(self).__name__.lower()
        if self.field is None:
            return name
        label = self.field if isinstance(self.field, str) else getattr(self.field, "__name__", "fn")
        return f"{name}({label})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.field == self.field  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.field if isinstance(self.field, str) else id(self.field)))


class Count(_FieldCombiner):
    """How many records (their values are not read)."""

    numeric = False
    reads_value = False

    def __init__(self) -> None:
        super().__init__(None)

    def extract(self, record: Record) -> Any:
        return 1

    def value_of(self, data: Any, raw: bytes) -> Any:
        return 1

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def add_all(self, acc: int, values: Sequence[Any]) -> int:
        return acc + len(values)

    def merge(self, acc: int, other: int) -> int:
        return acc + other

    def describe(self) -> str:
        return "count"


class Sum(_FieldCombiner):
    def create(self) -> int | float:
        return 0

    def add(self, acc: int | float, value: int | float) -> int | float:
        return acc + value

    def add_all(self, acc: int | float, values: Sequence[int | float]) -> int | float:
        for value in values:  # in order, not sum(): it compensates floats from Python 3.12
            acc = acc + value
        return acc

    def merge(self, acc: int | float, other: int | float) -> int | float:
        return acc + other


class Min(_FieldCombiner):
    """The smallest value; None for a window without values (never emitted: a window exists
    only once a record is in it)."""

    def create(self) -> int | float | None:
        return None

    def add(self, acc: int | float | None, value: int | float) -> int | float:
        return value if acc is None or value < acc else acc

    def add_all(self, acc: int | float | None, values: Sequence[int | float]) -> Any:
        if not values:
            return acc
        least = min(values)  # the first of equal values, as `add` keeps
        return least if acc is None or least < acc else acc

    def merge(self, acc: int | float | None, other: int | float | None) -> int | float | None:
        return other if acc is None else acc if other is None else min(acc, other)


class Max(_FieldCombiner):
    def create(self) -> int | float | None:
        return None

    def add(self, acc: int | float | None, value: int | float) -> int | float:
        return value if acc is None or value > acc else acc

    def add_all(self, acc: int | float | None, values: Sequence[int | float]) -> Any:
        if not values:
            return acc
        most = max(values)  # the first of equal values, as `add` keeps
        return most if acc is None or most > acc else acc

    def merge(self, acc: int | float | None, other: int | float | None) -> int | float | None:
        return other if acc is None else acc if other is None else max(acc, other)


class Mean(_FieldCombiner):
    """The arithmetic mean; the accumulator is `[sum, count]`."""

    def create(self) -> list[int | float]:
        return [0, 0]

    def add(self, acc: list[int | float], value: int | float) -> list[int | float]:
        return [acc[0] + value, acc[1] + 1]

    def add_all(self, acc: list[int | float], values: Sequence[int | float]) -> list[int | float]:
        total = acc[0]
        for value in values:
            total = total + value
        return [total, acc[1] + len(values)]

    def merge(self, acc: list[int | float], other: list[int | float]) -> list[int | float]:
        return [acc[0] + other[0], acc[1] + other[1]]

    def result(self, acc: list[int | float]) -> float | None:
        return acc[0] / acc[1] if acc[1] else None
