"""Real Redis, Kafka and Spark for tests, found or started in a fixed order of preference.

For Redis and for Kafka, each on its own:
  1. `env`: the service named by REDIS_URL / KAFKA_BOOTSTRAP_SERVERS (bring your own);
  2. `testcontainers`: a container, when a Docker engine answers (images from
     MILLSTREAM_TEST_REDIS_IMAGE / MILLSTREAM_TEST_KAFKA_IMAGE);
  3. `local-process`: a child process from `millstream.embedded`.
MILLSTREAM_TEST_INFRA=local skips step 2; =docker makes step 2 mandatory. Failing to get a service
is an error, never a skip. Containers use host networking on a port picked here: CI's dockerd runs
with `--bridge=none`, where published ports are silently ignored.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from millstream.embedded import (
    HOST,
    EmbeddedService,
    RedisService,
    _redis_cli_bin,
    check_java,
    free_port,
    new_cluster_id,
    start_kafka,
    start_redis,
)
from millstream.errors import ConfigurationError, MillstreamError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from testcontainers.core.container import DockerContainer

__all__ = [
    "InfraPlan",
    "KafkaHandle",
    "RedisClusterHandle",
    "RedisHandle",
    "acquire_kafka",
    "acquire_redis",
    "create_topic",
    "delete_topics",
    "docker_reachable",
    "kafka_flavor",
    "plan_infra",
    "spark_session_for_tests",
    "start_redis_cluster",
    "stop_spark_session",
]

Kind = Literal["env", "testcontainers", "local-process"]
DEFAULT_REDIS_IMAGE = "redis:7"
DEFAULT_KAFKA_IMAGE = "apache/kafka:3.8.0"
TOPIC_RETENTION_MS = "-1"  # explicit: Tansu omits retention.ms otherwise; -1 keeps old timestamps


class InfraError(MillstreamError):
    """Test infrastructure could not be provided; the message says which path failed and why."""


# ---------------------------------------------------------------- plan


def docker_reachable(environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(True, where) when a Docker engine answers a ping; else (False, why not)."""
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST")
    if not host and not Path("/var/run/docker.sock").exists():
        return False, "DOCKER_HOST is unset and /var/run/docker.sock does not exist"
    try:
        import docker
    except ImportError:
        return False, "the `docker` Python package is missing (pip install 'millstream[test]')"
    try:
        # ignore: mypy may resolve `docker` to the repository's docker/ folder (namespace package)
        client = docker.from_env(timeout=5, environment=dict(env))  # type: ignore[attr-defined]
    except Exception as exc:
        return False, f"no Docker client for {host or 'the default socket'}: {exc}"
    try:
        client.ping()
        return True, host or "unix:///var/run/docker.sock"
    except Exception as exc:
        return False, f"the Docker engine at {host or 'the default socket'} did not answer: {exc}"
    finally:
        client.close()


def kafka_flavor(
    image: str, environ: Mapping[str, str] | None = None
) -> Literal["tansu", "apache"]:
    """How to start a Kafka image: MILLSTREAM_TEST_KAFKA_FLAVOR, else guessed from its name."""
    env = os.environ if environ is None else environ
    forced = env.get("MILLSTREAM_TEST_KAFKA_FLAVOR", "").strip().lower()
    if forced in ("tansu", "apache"):
        return "tansu" if forced == "tansu" else "apache"
    if forced:
        raise ConfigurationError(
            f"MILLSTREAM_TEST_KAFKA_FLAVOR={forced!r} is invalid: expected tansu or apache."
        )
    return "tansu" if "tansu" in image.lower() else "apache"


@dataclass(frozen=True)
class InfraPlan:
    """Which path each service will take; decided once per test session."""

    redis: Kind
    kafka: Kind
    redis_image: str
    kafka_image: str
    kafka_flavor: Literal["tansu", "apache"]
    docker_note: str

    def label(self, service: Literal["redis", "kafka"]) -> str:
        kind = self.redis if service == "redis" else self.kafka
        if kind == "testcontainers":
            image = self.redis_image if service == "redis" else self.kafka_image
            return f"testcontainers({image})"
        return kind

    def header(self) -> str:
        return (
            f"millstream infra: redis={self.label('redis')} kafka={self.label('kafka')}"
            f" (docker: {self.docker_note})"
        )


def plan_infra(environ: Mapping[str, str] | None = None) -> InfraPlan:
    """Decide env / testcontainers / local-process for Redis and Kafka from the environment."""
    env = os.environ if environ is None else environ
    mode = env.get("MILLSTREAM_TEST_INFRA", "auto").strip().lower() or "auto"
    if mode not in ("auto", "docker", "local"):
        raise ConfigurationError(
            f"MILLSTREAM_TEST_INFRA={mode!r} is invalid: expected auto, docker or local."
        )
    redis_image = env.get("MILLSTREAM_TEST_REDIS_IMAGE") or DEFAULT_REDIS_IMAGE
    kafka_image = env.get("MILLSTREAM_TEST_KAFKA_IMAGE") or DEFAULT_KAFKA_IMAGE
    need_docker = not env.get("REDIS_URL") or not env.get("KAFKA_BOOTSTRAP_SERVERS")
    if mode == "local":
        use_docker, note = False, "not used (MILLSTREAM_TEST_INFRA=local)"
    elif not need_docker:
        use_docker, note = False, "not needed"
    else:
        use_docker, note = docker_reachable(env)
        if not use_docker and mode == "docker":
            raise InfraError(f"MILLSTREAM_TEST_INFRA=docker but no Docker engine: {note}")
    fallback: Kind = "testcontainers" if use_docker else "local-process"
    return InfraPlan(
        redis="env" if env.get("REDIS_URL") else fallback,
        kafka="env" if env.get("KAFKA_BOOTSTRAP_SERVERS") else fallback,
        redis_image=redis_image,
        kafka_image=kafka_image,
        kafka_flavor=kafka_flavor(kafka_image, env),
        docker_note=note,
    )


# ---------------------------------------------------------------- handles


@dataclass(kw_only=True)
class _Handle:
    kind: Kind
    detail: str
    _close: Callable[[], None] = field(default=lambda: None, repr=False)
    _kill9: Callable[[], None] | None = field(default=None, repr=False)
    _restart: Callable[[], None] | None = field(default=None, repr=False)
    process: EmbeddedService | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.kind}({self.detail})" if self.kind == "testcontainers" else self.kind

    def kill9(self) -> None:
        """Crash the service (SIGKILL); data not yet persisted is lost, as in a real crash."""
        if self._kill9 is None:
            raise InfraError(f"cannot crash a service we did not start ({self.kind}).")
        self._kill9()

    def restart(self) -> None:
        """Start the service again on the same address (after `kill9()` or while running)."""
        if self._restart is None:
            raise InfraError(f"cannot restart a service we did not start ({self.kind}).")
        self._restart()

    def close(self) -> None:
        self._close()


@dataclass(kw_only=True)
class RedisHandle(_Handle):
    url: str


@dataclass(kw_only=True)
class KafkaHandle(_Handle):
    bootstrap: str


def _from_process(service: EmbeddedService) -> dict[str, Any]:
    return {
        "kind": "local-process",
        "detail": f"pid {service.pid}",
        "_close": service.stop,
        "_kill9": service.kill9,
        "_restart": service.restart,
        "process": service,
    }


# ---------------------------------------------------------------- probes


def _wait(what: str, check: Callable[[], bool], timeout: float, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise InfraError(f"{what} did not become ready within {timeout:.0f}s. {why()}")
        time.sleep(0.1)


def _redis_ping(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _kafka_cluster_id(bootstrap: str) -> str | None:
    from confluent_kafka.admin import AdminClient

    try:
        return (
            AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            .list_topics(timeout=3)
            .cluster_id
        )
    except Exception:
        return None


# ---------------------------------------------------------------- containers


def _container_logs(container: DockerContainer) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:
        return f"(no logs: {exc})"
    text = (out + err).decode(errors="replace").strip().splitlines()
    return "container log tail:\n" + "\n".join(text[-20:])


def _container_running(container: DockerContainer) -> bool:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    return bool(wrapped.status == "running")


def _start_container(
    image: str, command: list[str], env: dict[str, str], ready: Callable[[], bool], timeout: float
) -> DockerContainer:
    """Start `image` on the host network and wait for `ready()`, failing fast if it exits."""
    os.environ.setdefault(
        "TESTCONTAINERS_RYUK_DISABLED", "true"
    )  # the reaper image can't be pulled
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer(image, env=env)
        .with_command(command)
        .with_name(f"millstream-test-{uuid.uuid4().hex[:10]}")
        .with_kwargs(network="host")  # `network`, not `network_mode`: testcontainers skips its own
    )
    try:
        container.start()
    except Exception as exc:
        raise InfraError(
            f"could not start container {image!r}: {exc}. Build it locally (see .ci/run) or set "
            "MILLSTREAM_TEST_INFRA=local to use local processes."
        ) from exc

    def check() -> bool:
        if not _container_running(container):
            raise InfraError(
                f"container {image!r} exited while starting. {_container_logs(container)}"
            )
        return ready()

    try:
        _wait(f"container {image!r}", check, timeout, lambda: _container_logs(container))
    except BaseException:
        with contextlib.suppress(Exception):
            container.stop()
        raise
    return container


def _container_controls(
    container: DockerContainer, wait_ready: Callable[[], None]
) -> tuple[Callable[[], None], Callable[[], None]]:
    def kill9() -> None:
        container.get_wrapped_container().kill(signal="SIGKILL")

    def restart() -> None:
        container.get_wrapped_container().restart(timeout=5)
        wait_ready()

    return kill9, restart


def _redis_container(image: str) -> RedisHandle:
    port = free_port()
    url = f"redis://{HOST}:{port}/0"
    command = [
        "redis-server", "--port", str(port), "--bind", HOST, "--protected-mode", "no",
        "--save", "", "--appendonly", "no",
    ]  # fmt: skip
    container = _start_container(image, command, {}, lambda: _redis_ping(url), timeout=60)

    def wait_ready() -> None:
        _wait(
            f"redis container {image!r}",
            lambda: _redis_ping(url),
            60,
            lambda: _container_logs(container),
        )

    kill9, restart = _container_controls(container, wait_ready)
    return RedisHandle(
        kind="testcontainers", detail=image, url=url,
        _close=container.stop, _kill9=kill9, _restart=restart,
    )  # fmt: skip


def _kafka_container(image: str, flavor: Literal["tansu", "apache"]) -> KafkaHandle:
    port = free_port()
    bootstrap = f"{HOST}:{port}"
    cluster_id = new_cluster_id()
    command: list[str] = []
    env: dict[str, str] = {}
    if flavor == "tansu":
        listener = f"tcp://{HOST}:{port}"
        command = [
            "broker", "--cluster-id", cluster_id, "--listener-url", listener,
            "--advertised-listener-url", listener, "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
    else:
        controller = free_port()
        env = {
            "CLUSTER_ID": cluster_id,
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller}",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{HOST}:{port}",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@{HOST}:{controller}",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            "KAFKA_NUM_PARTITIONS": "1",
            "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
            "KAFKA_HEAP_OPTS": "-Xmx512m -Xms256m",
        }

    def ready() -> bool:
        return _kafka_cluster_id(bootstrap) == cluster_id

    container = _start_container(image, command, env, ready, timeout=120)

    def wait_ready() -> None:
        _wait(f"kafka container {image!r}", ready, 120, lambda: _container_logs(container))

    kill9, restart = _container_controls(container, wait_ready)
    return KafkaHandle(
        kind="testcontainers", detail=f"{image}, {flavor}", bootstrap=bootstrap,
        _close=container.stop, _kill9=kill9, _restart=restart,
    )  # fmt: skip


# ---------------------------------------------------------------- acquire


def acquire_redis(
    plan: InfraPlan, workdir: Path, environ: Mapping[str, str] | None = None
) -> RedisHandle:
    """A Redis for the session, along `plan.redis`; raises InfraError if it cannot be had."""
    env = os.environ if environ is None else environ
    if plan.redis == "env":
        url = env["REDIS_URL"]
        if not _redis_ping(url):
            raise InfraError(f"REDIS_URL is set but Redis does not answer PING there ({url!r}).")
        return RedisHandle(kind="env", detail="REDIS_URL", url=url)
    if plan.redis == "testcontainers":
        return _redis_container(plan.redis_image)
    service = start_redis(workdir)
    return RedisHandle(url=service.url, **_from_process(service))


def acquire_kafka(
    plan: InfraPlan, workdir: Path, environ: Mapping[str, str] | None = None
) -> KafkaHandle:
    """A Kafka broker for the session, along `plan.kafka`; raises InfraError if it cannot be had."""
    env = os.environ if environ is None else environ
    if plan.kafka == "env":
        bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
        if _kafka_cluster_id(bootstrap) is None:
            raise InfraError(
                f"KAFKA_BOOTSTRAP_SERVERS={bootstrap!r} is set but no broker answers there."
            )
        return KafkaHandle(kind="env", detail="KAFKA_BOOTSTRAP_SERVERS", bootstrap=bootstrap)
    if plan.kafka == "testcontainers":
        return _kafka_container(plan.kafka_image, plan.kafka_flavor)
    service = start_kafka(workdir)
    return KafkaHandle(bootstrap=service.bootstrap, **_from_process(service))


# ---------------------------------------------------------------- topics


def create_topic(
    bootstrap: str,
    partitions: int = 1,
    name: str | None = None,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> str:
    """Create a topic (uuid name unless given) with explicit retention; return once visible."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = name or f"millstream-test-{uuid.uuid4().hex}"
    settings = {"retention.ms": TOPIC_RETENTION_MS, **(config or {})}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=settings)],
        request_timeout=timeout,
    )
    futures[topic].result(timeout=timeout)

    def visible() -> bool:
        meta = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        return meta is not None and meta.error is None and len(meta.partitions) == partitions

    _wait(f"topic {topic!r}", visible, timeout, lambda: f"bootstrap {bootstrap}")
    return topic


def delete_topics(bootstrap: str, topics: list[str], timeout: float = 10.0) -> None:
    """Best-effort cleanup; a broker that is gone or refuses is not a test failure."""
    if not topics:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    with contextlib.suppress(Exception):
        for future in admin.delete_topics(topics, request_timeout=timeout).values():
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)


# ---------------------------------------------------------------- redis cluster


@dataclass(kw_only=True)
class RedisClusterHandle:
    """Three (or more) masters (replicas when asked for). `url` names one node; clients
    discover the rest."""

    kind: Kind
    url: str
    nodes: list[str]
    processes: list[RedisService] = field(default_factory=list, repr=False)

    def close(self) -> None:
        for process in self.processes:
            process.stop()


def _cluster_ok(node: str) -> bool:
    import redis

    host, port = node.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=2)
    try:
        info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def start_redis_cluster(
    workdir: Path,
    masters: int = 3,
    environ: Mapping[str, str] | None = None,
    *,
    replicas: int = 0,
) -> RedisClusterHandle:
    """MILLSTREAM_TEST_REDIS_CLUSTER_URL if set, else `masters` local redis-server processes,
    each with `replicas` replicas (a failover test promotes one); `nodes` lists every node."""
    env = os.environ if environ is None else environ
    given = env.get("MILLSTREAM_TEST_REDIS_CLUSTER_URL")
    if given:
        import redis.cluster

        client = redis.cluster.RedisCluster.from_url(given)
        try:
            nodes = [f"{n.host}:{n.port}" for n in client.get_primaries()]
        finally:
            client.close()
        return RedisClusterHandle(kind="env", url=given, nodes=nodes)
    cli = _redis_cli_bin()
    processes: list[RedisService] = []
    try:
        for _ in range(masters * (1 + replicas)):
            # The bus port defaults to port+10000, which may be taken or exceed 65535: pick it too.
            args = [
                "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                "--cluster-node-timeout", "5000",
            ]  # fmt: skip
            proc = start_redis(workdir, extra_args=args)
            # Each node writes nodes.conf in its own --dir, so nodes never share a config file.
            processes.append(proc)
        nodes = [f"{HOST}:{p.port}" for p in processes]
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *nodes,
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            raise InfraError(
                f"redis-cli --cluster create failed ({created.returncode}): "
                f"{(created.stdout + created.stderr)[-2000:]}"
            )
        for node in nodes:
            _wait(f"redis cluster node {node}", partial(_cluster_ok, node), 30, lambda: "")
    except BaseException:
        for process in processes:
            process.stop()
        raise
    return RedisClusterHandle(
        kind="local-process", url=f"redis://{nodes[0]}/0", nodes=nodes, processes=processes
    )


# ---------------------------------------------------------------- spark


def spark_session_for_tests(workdir: Path, app_name: str = "millstream-tests") -> SparkSession:
    """A small local[2] session whose Python workers run this interpreter (and its packages)."""
    check_java()
    from millstream.connectors.python_workers import launcher

    os.environ["PYSPARK_PYTHON"] = launcher(workdir / "python") or sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", HOST)
    from pyspark.sql import SparkSession

    from millstream import jvm_archive  # not at import: `python -m` runs it as a script
    from millstream.connectors.spark_session import LOCAL_CHECKPOINTS, WORKER_DAEMON
    from millstream.settings import DRIVER_JAVA_OPTIONS

    workdir.mkdir(parents=True, exist_ok=True)
    builder: Any = SparkSession.builder
    return (  # type: ignore[no-any-return]
        builder.master("local[2]")
        .appName(app_name)
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", HOST)
        .config("spark.driver.bindAddress", HOST)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.authenticate.socketTimeout", "60s")  # as spark_session does
        .config("spark.python.daemon.module", WORKER_DAEMON)  # as spark_session does
        .config("spark.local.dir", str(workdir / "local"))
        .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
        .config("spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINTS)  # as run
        .config(  # the JVM a pipeline's driver runs (MILLSTREAM_DRIVER_JAVA_OPTIONS's default)
            "spark.driver.extraJavaOptions",
            " ".join([*DRIVER_JAVA_OPTIONS.split(), *jvm_archive.java_options()]),
        )
        .getOrCreate()
    )


def stop_spark_session(session: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session *and* its JVM, and reap the JVM: PID 1 here does not reap orphans.

    `SparkSession.stop()` leaves the JVM to exit on its own once our stdin pipe closes; if we
    exit first, it ends up a <defunct> child of PID 1.
    """
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.stdin.close()  # the gateway server exits on EOF
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
