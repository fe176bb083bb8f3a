"""The steady-run scenario's memory verdict: medians per minute and the second-half slope."""

from __future__ import annotations

from millstream.bench.steady import _slope_mb_per_min, summarise


def _samples(seconds: int, total: float, per_min: float) -> list[dict[str, float]]:
    return [
        {"at": float(t), "total": total + per_min * t / 60, "java": 500.0, "python": 100.0}
        for t in range(0, seconds + 1, 5)
    ]


def test_flat_memory_has_no_growth_and_zero_slope() -> None:
    memory = summarise(_samples(600, 1000.0, 0.0), 600)
    assert memory["total"]["growth_mb"] == 0
    assert memory["total"]["second_half_slope_mb_per_min"] == 0
    assert memory["java"]["first_minute_median_mb"] == 500.0


def test_a_leak_shows_as_growth_and_slope() -> None:
    memory = summarise(_samples(600, 1000.0, 3.0), 600)  # 3 MiB per minute
    assert memory["total"]["second_half_slope_mb_per_min"] == 3.0
    # minute-1 samples 60..115 s (median at 87.5 s), last minute 540..600 s (median at 570 s)
    assert memory["total"]["growth_mb"] == round(3.0 * (570 - 87.5) / 60, 1)
    assert memory["total"]["peak_mb"] == 1030.0


def test_slope_needs_three_points() -> None:
    assert _slope_mb_per_min([(0.0, 1.0), (5.0, 2.0)]) is None
