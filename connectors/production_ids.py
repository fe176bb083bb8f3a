"""Ids of strong productions: unique and cheap.

A strong production's id is fixed when it is checkpointed (stored in the same commit as its
cause), so it needs only to be unique: consumers, sinks and the IdRegistry tell productions
apart by it. `uuid.uuid4()` costs a system call and an object per production (7% of a joiner's
shard work in the join bench); instead each process draws 8 random bytes once, again in every
forked child (Spark's Python workers fork from one daemon), and counts: 8 random bytes and an
8-byte counter, 16 bytes as before. Two processes collide only if they draw the same 64 bits.
"""

from __future__ import annotations

import itertools
import os


class _Ids:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.prefix = os.urandom(8)
        self.counter = itertools.count()  # next() on it is atomic under the GIL

    def new(self) -> bytes:
        return self.prefix + next(self.counter).to_bytes(8, "big")


_IDS = _Ids()
os.register_at_fork(after_in_child=_IDS.reset)


def new_production_id() -> bytes:
    """A fresh 16-byte id, unique across processes and forks."""
    return _IDS.new()
