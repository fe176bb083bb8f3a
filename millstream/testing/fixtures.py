"""pytest fixtures for real Redis, Kafka and Spark.

Enable them in a conftest.py with `pytest_plugins = ["millstream.testing.fixtures"]`.

Services are session-scoped (starting them is the slow part); isolation is per test: a fresh
topic (`kafka_topic_factory`), a fresh key namespace (`redis_namespace`), a fresh checkpoint
folder (`tmp_checkpoint`). Where each service comes from is printed in the report header and
again in the terminal summary (see `millstream.testing.infra` for the order of preference).
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from millstream.embedded import (
    KafkaService,
    RedisService,
    start_kafka_durable,
    start_redis,
)
from millstream.errors import MillstreamError
from millstream.testing.infra import (
    InfraPlan,
    KafkaHandle,
    RedisClusterHandle,
    RedisHandle,
    acquire_kafka,
    acquire_redis,
    create_topic,
    plan_infra,
    spark_session_for_tests,
    start_redis_cluster,
    stop_spark_session,
)

if TYPE_CHECKING:
    import redis
    from pyspark.sql import SparkSession

_PLAN = pytest.StashKey[InfraPlan]()
_USED = pytest.StashKey[dict[str, str]]()
_SIGTERM = pytest.StashKey[Any]()


def _plan(config: pytest.Config) -> InfraPlan:
    if _PLAN not in config.stash:
        config.stash[_PLAN] = plan_infra()
    return config.stash[_PLAN]


def _record(config: pytest.Config, service: str, label: str) -> None:
    config.stash.setdefault(_USED, {})[service] = label


# ---------------------------------------------------------------- hooks


def _sigterm_to_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """Make SIGTERM unwind like Ctrl-C so session teardown stops every service we started."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        config.stash[_SIGTERM] = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SIGTERM in config.stash:
        signal.signal(signal.SIGTERM, config.stash[_SIGTERM])


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        return [_plan(config).header()]
    except MillstreamError as exc:  # the fixtures raise it again, as a test error
        return [f"millstream infra: unavailable: {exc}"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist a worker hands the services it used to the controller's summary."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        used = session.config.stash.setdefault(_USED, {})
        output["millstream_infra_used"] = dict(used)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist's controller: collect what each worker's fixtures started."""
    used = getattr(node, "workeroutput", {}).get("millstream_infra_used", {})
    for service, label in used.items():
        _record(node.config, service, label)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    used = config.stash.get(_USED, {})
    if used:
        line = " ".join(f"{name}={label}" for name, label in sorted(used.items()))
        terminalreporter.write_line(f"millstream infra used: {line}")


# ---------------------------------------------------------------- redis


@pytest.fixture(scope="session")
def millstream_infra_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Working folder (logs, data) of the services this session starts."""
    return tmp_path_factory.mktemp("millstream-infra")


@pytest.fixture(scope="session")
def redis_service(
    request: pytest.FixtureRequest, millstream_infra_dir: Path
) -> Iterator[RedisHandle]:
    """The session's Redis: `.url`, `.kind`, and `.kill9()` / `.restart()` when we started it."""
    handle = acquire_redis(_plan(request.config), millstream_infra_dir / "redis")
    _record(request.config, "redis", handle.label)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="session")
def redis_url(redis_service: RedisHandle) -> str:
    return redis_service.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A fresh client per test; pair it with `redis_namespace` for isolated keys."""
    import redis as redis_py

    client = redis_py.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def redis_namespace() -> str:
    """A unique name per test, for MILLSTREAM_APP or a key prefix, so tests never share keys."""
    return f"mstest-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def redis_cluster(
    request: pytest.FixtureRequest, millstream_infra_dir: Path
) -> Iterator[RedisClusterHandle]:
    """A 3-master Redis Cluster (local processes): `.url` of one node and `.nodes`."""
    handle = start_redis_cluster(millstream_infra_dir / "redis-cluster")
    _record(request.config, "redis-cluster", handle.kind)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisService]:
    """A private local redis-server with AOF and fsync always, for kill9()/restart() tests."""
    service = start_redis(tmp_path / "durable-redis", appendonly=True)
    try:
        yield service
    finally:
        service.stop()


# ---------------------------------------------------------------- kafka


@pytest.fixture(scope="session")
def kafka_service(
    request: pytest.FixtureRequest, millstream_infra_dir: Path
) -> Iterator[KafkaHandle]:
    """The session's Kafka broker: `.bootstrap`, `.kind`, `.kill9()` / `.restart()` when ours."""
    handle = acquire_kafka(_plan(request.config), millstream_infra_dir / "kafka")
    _record(request.config, "kafka", handle.label)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_service: KafkaHandle) -> str:
    return kafka_service.bootstrap


@pytest.fixture
def kafka_topic_factory(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """`make(partitions=1, name=None, config=None) -> topic`: fresh uuid-named topics."""

    def make(
        partitions: int = 1, name: str | None = None, config: Mapping[str, str] | None = None
    ) -> str:
        return create_topic(kafka_bootstrap, partitions=partitions, name=name, config=config)

    # Topics are uuid-named and left in place: deleting a topic on the embedded broker shortly
    # after a consumer fetched it crashes librdkafka's metadata cache (a Tansu defect), and
    # injectors keep consumers cached in Spark's Python workers across tests.
    yield make


@pytest.fixture
def durable_kafka(tmp_path: Path) -> Iterator[KafkaService]:
    """A private Tansu on local S3 (moto): topics, data and offsets survive kill9() + restart()."""
    service = start_kafka_durable(tmp_path / "durable-kafka")
    try:
        yield service
    finally:
        service.stop()


# ---------------------------------------------------------------- spark


@pytest.fixture(scope="session")
def spark(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkSession]:
    """One local[2] SparkSession per test session: it takes seconds to start."""
    session = spark_session_for_tests(tmp_path_factory.mktemp("spark"))
    _record(request.config, "spark", "local[2]")
    try:
        yield session
    finally:
        stop_spark_session(session)


@pytest.fixture
def tmp_checkpoint(tmp_path: Path) -> str:
    """A fresh, empty streaming checkpoint folder (a str, as Spark options take)."""
    path = tmp_path / "checkpoint"
    path.mkdir()
    return str(path)
