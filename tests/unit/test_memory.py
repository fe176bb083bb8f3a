"""`connectors/memory.py`: freed batch memory goes back to the OS; a user's arena cap stands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from millstream.connectors import memory

pytestmark = pytest.mark.skipif(memory._glibc() is None, reason="glibc only")

# A batch's worth of rows: 1 KB values (malloc, not Python's small-object arenas), one in a
# hundred kept as a later batch would keep a few, which pins glibc's heap top.
_CHILD = """
import sys
from millstream.connectors import memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

rows = [bytes(1000) + i.to_bytes(4, "big") for i in range(200_000)]
kept = rows[::100]
del rows
freed = rss_mb()
if sys.argv[1] == "trim":
    memory.trim()
print(f"{freed:.1f} {rss_mb():.1f}", flush=True)
"""


def _rss(mode: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), float(out[1])


def test_trim_gives_a_freed_batch_back() -> None:
    freed, after = _rss("keep")
    assert after > freed - 20, (freed, after)  # without a trim glibc keeps the pages
    freed, trimmed = _rss("trim")
    assert freed > 150, freed  # the freed rows were still resident
    assert trimmed < freed - 100, (freed, trimmed)


def test_cap_arenas_leaves_the_environment_alone() -> None:
    """The cap is this process's: exported, the JVM's memory grew by what the driver saved."""
    before = dict(os.environ)
    memory.cap_arenas()
    assert dict(os.environ) == before
