"""Helpers for end-to-end tests: a running millstream application on the shared fixtures."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from millstream.connectors.app import Application
from millstream.connectors.driver import Endpoints
from millstream.connectors.topology import Topology
from millstream.settings import Settings


@pytest.fixture
def start_app(
    spark: Any, redis_url: str, kafka_bootstrap: str, tmp_path: Any
) -> Iterator[Callable[..., Application]]:
    """`start_app(topology, **settings)`: prepare and start every computation; stopped after."""
    from millstream.injectors import register

    register(spark)
    apps: list[Application] = []

    def start(topology: Topology, **overrides: Any) -> Application:
        settings = Settings(
            redis_url=redis_url,
            kafka_bootstrap_servers=kafka_bootstrap,
            app=topology.app,
            checkpoint_dir=str(tmp_path / "checkpoints"),
            **{"shards": 4, "trigger_ms": 200, **overrides},
        )
        ends = Endpoints(redis_url=redis_url, kafka={"bootstrap.servers": kafka_bootstrap})
        app = Application(topology, settings, ends, spark)
        app.prepare()
        app.start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.stop()


def wait_until(condition: Callable[[], bool], timeout: float, what: str, app: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app is not None:
            app.check()
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
