"""Context state effects: encoded once per call, re-encoded after a change."""

from __future__ import annotations

import json
from typing import Any

from millstream.connectors.computation import Context


class CountingSerde:
    def __init__(self) -> None:
        self.dumped = 0

    def dumps(self, value: Any) -> bytes:
        self.dumped += 1
        return json.dumps(value).encode()

    def loads(self, raw: bytes) -> Any:
        return json.loads(raw)


def _ctx(serde: CountingSerde, state: bytes | None = None) -> Context:
    return Context(
        "k", state=state, serde=serde, low_watermark=0, now=0, timestamp=0,  # type: ignore[arg-type]
        outputs=frozenset(),
    )  # fmt: skip


def test_state_is_encoded_once_however_often_the_effect_is_asked() -> None:
    serde = CountingSerde()
    ctx = _ctx(serde)
    ctx.set_state({"n": 1})
    assert ctx.state_effect() == (True, b'{"n": 1}')
    assert ctx.state_effect() == (True, b'{"n": 1}')
    assert serde.dumped == 1


def test_a_later_change_is_encoded_again() -> None:
    serde = CountingSerde()
    ctx = _ctx(serde, state=b"5")
    assert ctx.state_effect() == (False, None)
    ctx.set_state(ctx.get_state() + 1)
    assert ctx.state_effect() == (True, b"6")
    ctx.set_state(7)
    assert ctx.state_effect() == (True, b"7")
    ctx.delete_state()
    assert ctx.state_effect() == (True, None)
    assert serde.dumped == 2
