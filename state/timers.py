"""Timer encoding: one member per (key, tag) in a sorted set per time domain, scored by time."""

from __future__ import annotations

from millstream.records import TimeDomain, Timer

_SEP = "\x1f"


def timer_member(key: str, tag: str) -> str:
    return f"{key}{_SEP}{tag}"


def timer_key(member: str) -> str:
    return member.split(_SEP, 1)[0]


def parse_timer(
    member: bytes | str, score: float, domain: TimeDomain, hold: float | None = None
) -> Timer:
    text = member.decode() if isinstance(member, bytes) else member
    key, tag = text.split(_SEP, 1)
    return Timer(
        key=key, tag=tag, time=int(score), domain=domain, hold=None if hold is None else int(hold)
    )


def firing_order(timers: list[Timer]) -> list[Timer]:
    """Increasing time, per key; ties broken by domain then tag so replays fire identically."""
    return sorted(timers, key=lambda t: (t.time, t.key, t.domain.value, t.tag))
