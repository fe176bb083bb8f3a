"""Shared fixtures: real Redis, Kafka and Spark (see millstream.testing.fixtures)."""

from collections.abc import Iterator

import pytest

from millstream.injectors._kafka_read import close_consumers

pytest_plugins = ["millstream.testing.fixtures"]


@pytest.fixture(autouse=True)
def _no_warm_consumer_outlives_its_test() -> Iterator[None]:
    """A driver read in this process keeps its Kafka consumers warm for the next batch: close
    them after each test, while its broker still runs (a stopped private broker would leave
    them logging connection failures for the rest of the session)."""
    yield
    close_consumers()
