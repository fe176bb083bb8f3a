"""Verification by record id and fault schedules: pure functions of their inputs."""

from __future__ import annotations

import pytest

from millstream.testing.faults import FAULT_KINDS, fault_schedule
from millstream.testing.verify import compare_ids


def test_exactly_once_when_every_id_appears_once() -> None:
    report = compare_ids(["a", "b", "b", "c"], ["c", "a", "b"])  # "b" resent upstream: one id
    assert report.exactly_once
    assert (report.expected, report.observed) == (3, 3)
    assert "exactly once" in report.summary()


def test_loss_duplicate_and_unexplained_output_are_named() -> None:
    report = compare_ids(["a", "b", "c"], ["a", "a", "c", "z"])
    assert not report.exactly_once
    assert report.missing == ("b",)
    assert report.duplicated == {"a": 2}
    assert report.unexpected == ("z",)
    text = report.summary()
    assert "1 missing (e.g. b)" in text and "a x2" in text and "1 unexpected (e.g. z)" in text


def test_cancelling_errors_are_not_hidden_by_equal_counts() -> None:
    report = compare_ids(["a", "b"], ["a", "a"])  # two in, two out, still wrong
    assert report.observed == report.expected and not report.exactly_once


def test_schedule_is_reproducible_and_covers_every_kind() -> None:
    first = fault_schedule(3, 300.0, every_s=20.0)
    assert first == fault_schedule(3, 300.0, every_s=20.0)
    assert first != fault_schedule(4, 300.0, every_s=20.0)
    assert set(FAULT_KINDS) <= {f.kind for f in first}
    times = [f.at_s for f in first]
    assert times == sorted(times) and times[0] == 20.0 and times[-1] <= 280.0


def test_short_runs_get_at_least_one_fault_and_unknown_kinds_fail() -> None:
    assert len(fault_schedule(1, 15.0, ["kill-pipeline"], every_s=10.0)) == 1
    with pytest.raises(ValueError, match="unknown fault kind 'reboot'"):
        fault_schedule(1, 60.0, ["reboot"])
