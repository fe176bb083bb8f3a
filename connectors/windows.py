"""Event-time windows: which windows a record belongs to, and how session windows merge.

Pure functions of timestamps (ms), Beam's window functions in small: a window is the
half-open interval `[start, end)`; it is complete once the low watermark reaches `end` (every
record still to come has a timestamp at or after it), and its result is stamped at `end`.
Fixed windows align to the epoch, as Beam's and Flink's do.
"""

from __future__ import annotations

from dataclasses import dataclass

from millstream.errors import ConfigurationError

Window = tuple[int, int]  # [start, end)


class WindowKind:
    """How records are assigned to windows. `merging` kinds (sessions) merge overlapping
    windows of a key; the others never change a window once assigned."""

    merging = False

    def assign(self, timestamp: int) -> list[Window]:
        raise NotImplementedError

    def last_end(self, timestamp: int) -> int:
        """The latest end among the record's windows (whether any still accepts it)."""
        return max(end for _, end in self.assign(timestamp))

    def describe(self) -> str:
        raise NotImplementedError


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive int of milliseconds, got {value!r}")
    return value


@dataclass(frozen=True)
class Tumbling(WindowKind):
    """Windows of `size_ms` one after the other: each record in exactly one."""

    size_ms: int

    def __post_init__(self) -> None:
        _positive("Tumbling size_ms", self.size_ms)

    def assign(self, timestamp: int) -> list[Window]:
        start = timestamp - timestamp % self.size_ms
        return [(start, start + self.size_ms)]

    def last_end(self, timestamp: int) -> int:
        return timestamp - timestamp % self.size_ms + self.size_ms

    def describe(self) -> str:
        return f"tumbling {self.size_ms} ms"


@dataclass(frozen=True)
class Hopping(WindowKind):
    """Windows of `size_ms` starting every `every_ms` (Beam's sliding windows): a record is in
    `size_ms / every_ms` of them (rounded up), the earliest first."""

    size_ms: int
    every_ms: int

    def __post_init__(self) -> None:
        _positive("Hopping size_ms", self.size_ms)
        _positive("Hopping every_ms", self.every_ms)
        if self.every_ms > self.size_ms:
            raise ConfigurationError(
                f"Hopping every_ms={self.every_ms} is longer than size_ms={self.size_ms}: "
                "records between windows would belong to none"
            )

    def assign(self, timestamp: int) -> list[Window]:
        last = timestamp - timestamp % self.every_ms
        starts = range(last, timestamp - self.size_ms, -self.every_ms)
        return [(s, s + self.size_ms) for s in reversed(starts)]

    def last_end(self, timestamp: int) -> int:
        return timestamp - timestamp % self.every_ms + self.size_ms

    def describe(self) -> str:
        return f"hopping {self.size_ms} ms every {self.every_ms} ms"


@dataclass(frozen=True)
class Session(WindowKind):
    """Per key, records less than `gap_ms` apart form one session: a record opens
    `[t, t + gap_ms)`, and overlapping sessions of a key merge (a record can bridge two)."""

    gap_ms: int
    merging = True

    def __post_init__(self) -> None:
        _positive("Session gap_ms", self.gap_ms)

    def assign(self, timestamp: int) -> list[Window]:
        return [(timestamp, timestamp + self.gap_ms)]

    def last_end(self, timestamp: int) -> int:
        return timestamp + self.gap_ms

    def describe(self) -> str:
        return f"session gap {self.gap_ms} ms"


def merge_overlapping(windows: list[Window]) -> dict[Window, list[Window]]:
    """Group windows that overlap (transitively) into their union: union -> members."""
    out: dict[Window, list[Window]] = {}
    current: list[Window] = []
    start = end = 0
    for window in sorted(windows):
        if current and window[0] < end:
            current.append(window)
            end = max(end, window[1])
            continue
        if current:
            out[(start, end)] = current
        current, (start, end) = [window], window
    if current:
        out[(start, end)] = current
    return out
