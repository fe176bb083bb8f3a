"""Registering the injectors skips Spark's Python-path scan only where Spark keeps its registry."""

from __future__ import annotations

from millstream.injectors import _skip_static_source_lookup


def test_a_spark_without_the_static_source_registry_is_left_to_scan() -> None:
    class NoJvm:
        sparkContext = None

    assert _skip_static_source_lookup(NoJvm()) is False
