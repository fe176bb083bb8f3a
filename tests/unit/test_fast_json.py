"""connectors/_json.py answers as the standard library's json does, on the inputs where the
fast libraries would differ (NaN, big integers, non-str keys, BOMs, lax number forms)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import random

import pytest

from millstream.connectors import _json


def std_dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


@dataclasses.dataclass
class Point:
    x: int


class Name(str):
    pass


ENCODABLE = [
    {"b": 1, "a": {"d": [1, 2.5, None, True], "c": "x"}},
    2**70,
    -(2**64) - 1,
    {2: "int keys", 1: "become str"},
    {True: 1},
    {None: 2},
    {1.5: 3},
    [1.5, -0.0, 1e16, 5e-324, 0.30000000000000004],
    Name("a str subclass"),
    (1, 2),
    "\x00\u2028",
]


@pytest.mark.parametrize("value", ENCODABLE, ids=repr)
def test_dumps_is_the_standard_librarys_json(value: object) -> None:
    assert json.loads(_json.dumps(value)) == json.loads(std_dumps(value))


@pytest.mark.parametrize("value", [float("nan"), {"x": float("inf")}, [float("-inf")]], ids=repr)
def test_non_finite_floats_are_kept_not_written_as_null(value: object) -> None:
    assert _json.dumps(value) == std_dumps(value)


@pytest.mark.parametrize(
    "value", [Point(1), datetime.datetime(2020, 1, 1), {1, 2}, b"bytes"], ids=repr
)
def test_what_json_refuses_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        std_dumps(value)
    with pytest.raises(TypeError):
        _json.dumps(value)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"q":"q0001","ts":1700000000123}',
        b"1180591620717411303424",
        b"NaN",
        b"[Infinity,-Infinity]",
        b"1e400",
        b"\xef\xbb\xbf[1]",
        b'"\\ud800"',
        "[1]".encode("utf-16"),
        b' {"a":1,"a":2} ',
    ],
    ids=repr,
)
def test_loads_is_the_standard_librarys_json(raw: bytes) -> None:
    expected, got = json.loads(raw), _json.loads(raw)
    assert type(got) is type(expected)
    assert got == expected or (isinstance(got, float) and math.isnan(got) and math.isnan(expected))


@pytest.mark.parametrize(
    "raw", [b"01", b"-", b"1.", b'"a\tb"', b"[1,2,]", b"{'a':1}", b"", b"\xff"], ids=repr
)
def test_loads_refuses_what_json_refuses(raw: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(ValueError):
        _json.loads(raw)


def test_floats_round_trip_exactly() -> None:
    rng = random.Random(3)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-300, 300) for _ in range(2000)]
    assert _json.loads(_json.dumps(values)) == values
    assert _json.loads(std_dumps(values)) == values
