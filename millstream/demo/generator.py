"""Deterministic search-query traffic with injected spikes, dips, disorder, duplicates, late data.

The whole schedule is planned from the seed before anything is sent, so the ground truth is a
function of the plan alone, computed without any of the pipeline's code.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

MAX_DELAY_MS = 800  # on-time events arrive at most this much after their event time
LATE_BY_MS = 300_000  # late events carry an event time this far in the past: unambiguously late
WINDOW_MS = 1000


@dataclass(frozen=True, slots=True)
class Event:
    send_ms: int  # offset from the start of the run
    event_ms: int  # offset from the start of the run (may be negative for late events)
    query: str
    event_id: str
    channel: str  # "kafka" (datacenter 1) or "logs" (datacenter 2)
    kind: str  # "event", "duplicate" (a second send of an event id) or "late"


@dataclass(frozen=True)
class Episode:
    kind: str  # "spike" or "dip"
    queries: tuple[str, ...]
    start_ms: int
    end_ms: int


@dataclass
class Plan:
    events: list[Event]
    episodes: list[Episode]
    duration_ms: int
    quiet_start_ms: int  # no late events before this (the watermark is not known yet)
    counters: Counter[str] = field(default_factory=Counter)


def query_name(rank: int) -> str:
    return f"q{rank:04d}"


def plan_traffic(
    *, duration_s: float, rate: float, duplicates: float, late: float, seed: int, queries: int
) -> Plan:
    """Plan every send: Zipf popularity, a compressed daily cycle, spikes, dips and disorder."""
    rng = random.Random(seed)
    duration_ms = int(duration_s * 1000)
    weights = [1.0 / (rank**1.1) for rank in range(1, queries + 1)]
    total = sum(weights)
    shares = [w / total for w in weights]
    names = [query_name(r) for r in range(1, queries + 1)]

    # Spikes on mid-popularity queries, dips (a "region outage") on popular ones.
    spike_ranks = [min(queries, 15), min(queries, 25)]
    dip_sets = [names[1:4], names[4:7]]
    episodes = [
        Episode(
            "spike",
            (names[spike_ranks[0] - 1],),
            int(duration_ms * 0.30),
            int(duration_ms * 0.30) + 6000,
        ),
        Episode("dip", tuple(dip_sets[0]), int(duration_ms * 0.45), int(duration_ms * 0.45) + 8000),
        Episode(
            "spike",
            (names[spike_ranks[1] - 1],),
            int(duration_ms * 0.62),
            int(duration_ms * 0.62) + 6000,
        ),
        Episode("dip", tuple(dip_sets[1]), int(duration_ms * 0.78), int(duration_ms * 0.78) + 8000),
    ]

    events: list[Event] = []
    counters: Counter[str] = Counter()
    serial = 0
    tick = 100
    quiet_start = min(15_000, duration_ms // 4)
    for start in range(0, duration_ms, tick):
        cycle = 1.0 + 0.3 * math.sin(2 * math.pi * start / duration_ms)
        expected = rate * cycle * tick / 1000
        count = _poisson(rng, expected)
        chosen = rng.choices(names, weights=shares, k=count)
        for ep in episodes:
            if ep.kind == "spike" and ep.start_ms <= start < ep.end_ms:
                chosen += [ep.queries[0]] * _poisson(rng, 30 * tick / 1000)
        for query in chosen:
            if any(
                ep.kind == "dip" and query in ep.queries and ep.start_ms <= start < ep.end_ms
                for ep in episodes
            ):
                continue
            serial += 1
            send = start + rng.randrange(tick)
            channel = "kafka" if rng.random() < 0.5 else "logs"
            event_id = f"e{seed}-{serial}"
            if start >= quiet_start and rng.random() < late:
                events.append(Event(send, send - LATE_BY_MS, query, event_id, channel, "late"))
                counters["late"] += 1
                continue
            delay = min(MAX_DELAY_MS, int(rng.expovariate(1 / 150)))
            event_ms = max(0, send - delay)
            events.append(Event(send, event_ms, query, event_id, channel, "event"))
            counters["events"] += 1
            if rng.random() < duplicates:
                again = min(duration_ms - 1, send + rng.randrange(50, 1000))
                events.append(Event(again, event_ms, query, event_id, channel, "duplicate"))
                counters["duplicates"] += 1
    events.sort(key=lambda e: (e.send_ms, e.event_id))
    return Plan(events, episodes, duration_ms, quiet_start, counters)


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def window_truth(plan: Plan, start_wall_ms: int) -> dict[tuple[str, int], int]:
    """Ground truth: distinct on-time events per (query, 1-second window start, wall ms)."""
    truth: Counter[tuple[str, int]] = Counter()
    for event in plan.events:
        if event.kind != "event":
            continue
        wall = start_wall_ms + event.event_ms
        truth[(event.query, wall - wall % WINDOW_MS)] += 1
    return dict(truth)
