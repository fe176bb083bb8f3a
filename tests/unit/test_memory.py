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
import os
import sys

from millstream.connectors import memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

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
    freed, _ = _rss("keep")
    assert freed > 150, freed  # freed, the rows' pages are still resident without a trim
    freed, trimmed = _rss("trim")
    assert trimmed < freed - 100, (freed, trimmed)


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


@pytest.mark.parametrize(
    ("env", "capped"),
    [
        ({}, True),
        ({"MALLOC_ARENA_MAX": "8"}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, True),
    ],
)
def test_cap_arenas_unless_the_user_chose(
    env: dict[str, str], capped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's own cap; a user's MALLOC_ARENA_MAX or arena_max tunable stands, and the
    environment (which the JVM would inherit) is left alone."""
    fake = _FakeLibc()
    monkeypatch.setattr(memory, "_glibc", lambda: fake)
    for name in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    memory.cap_arenas()
    assert fake.calls == ([(memory._M_ARENA_MAX, memory.ARENAS)] if capped else [])
    assert dict(os.environ) == before
