"""Compare a pipeline's output with ground truth record by record (Photon's verification idea).

Counts alone hide errors that cancel out (one record lost, another doubled). Matching ids says
which inputs never produced output, which produced it twice, and which outputs no input explains.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class IdReport:
    """The outcome of `compare_ids`: empty `missing`, `duplicated` and `unexpected` is exactly-once."""

    expected: int
    observed: int
    missing: tuple[str, ...]
    duplicated: dict[str, int]
    unexpected: tuple[str, ...]

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)

    def summary(self, limit: int = 5) -> str:
        """One line a person can act on: counts, and a few ids of each kind of error."""
        parts = [f"{self.expected} expected ids, {self.observed} outputs"]
        if self.missing:
            parts.append(f"{len(self.missing)} missing (e.g. {', '.join(self.missing[:limit])})")
        if self.duplicated:
            sample = ", ".join(f"{i} x{n}" for i, n in list(self.duplicated.items())[:limit])
            parts.append(f"{len(self.duplicated)} duplicated (e.g. {sample})")
        if self.unexpected:
            sample = ", ".join(self.unexpected[:limit])
            parts.append(f"{len(self.unexpected)} unexpected (e.g. {sample})")
        if self.exactly_once:
            parts.append("exactly once")
        return "; ".join(parts)


def compare_ids(expected: Iterable[str], observed: Iterable[str]) -> IdReport:
    """`expected`: ids that must each appear once (repeats are ignored); `observed`: output ids."""
    want = set(expected)
    seen = Counter(observed)
    return IdReport(
        expected=len(want),
        observed=sum(seen.values()),
        missing=tuple(sorted(want - seen.keys())),
        duplicated={i: n for i, n in sorted(seen.items()) if n > 1 and i in want},
        unexpected=tuple(sorted(seen.keys() - want)),
    )
