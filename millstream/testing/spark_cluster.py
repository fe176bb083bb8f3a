"""A small Spark standalone cluster on one machine, for end-to-end tests and the scaling bench:
a master and N 1-core workers, each binding its own loopback address (127.0.0.2, 127.0.0.3, ...),
i.e. N hosts to Spark's scheduler.

Each daemon runs in its own session; `kill_executor` SIGKILLs one executor JVM (its worker
launches a new one), `kill_worker` SIGKILLs a whole worker with everything under it (daemon,
executors, their Python workers), for good. `pythonpath` goes on the workers' PYTHONPATH, so
executors import the modules a driver's topology names (a test's `tests.e2e.*_target`) as a
user's workers import theirs. A driver reaches it with `driver_conf` as SPARK_CONF_DIR.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def worker_hosts(count: int) -> tuple[str, ...]:
    return tuple(f"127.0.0.{2 + i}" for i in range(count))


HOSTS = worker_hosts(2)


def driver_conf(folder: Path, cores: int = 2, executor_memory: str = "512m") -> Path:
    """A SPARK_CONF_DIR for a driver of this cluster: it binds loopback so the workers'
    executors reach it; the application takes at most `cores` cores."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spark-defaults.conf").write_text(
        "spark.driver.host 127.0.0.1\n"
        "spark.driver.bindAddress 127.0.0.1\n"
        f"spark.executor.memory {executor_memory}\n"
        f"spark.cores.max {cores}\n"
    )
    return folder


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark daemon or driver run from this virtualenv's PySpark."""
    import pyspark

    return {
        **os.environ,
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **extra,
    }


def wait_for_log(path: Path, text: str, count: int, timeout: float, procs: list[Any]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a Spark daemon exited: {path.read_text()[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {text!r} x{count} in {path}")


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (ppid is field 4 of /proc/PID/stat)."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@dataclass
class SparkCluster:
    master: str
    work_dir: Path
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def executors(self, host: str | None = None) -> list[int]:
        """PIDs of the executor JVMs running now (on `host`, or on every live worker)."""
        found = []
        for name, worker in self.workers.items():
            if (host is not None and name != host) or worker.poll() is not None:
                continue
            for pid in descendants(worker.pid)[1:]:
                if EXECUTOR_CLASS in _cmdline(pid):
                    found.append(pid)
        return found

    def kill_executor(self, host: str) -> int:
        """SIGKILL the executor JVM on `host`; its worker starts another."""
        pids = self.executors(host)
        assert pids, f"no executor runs on {host}"
        os.kill(pids[0], signal.SIGKILL)
        return pids[0]

    def kill_worker(self, host: str) -> list[int]:
        """SIGKILL the worker on `host` and everything under it; it does not come back."""
        worker = self.workers[host]
        pids = descendants(worker.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.wait(10)
        return pids


@contextlib.contextmanager
def standalone_cluster(
    work: Path, workers: int = 2, memory_mb: int = 768, pythonpath: tuple[str, ...] = ()
) -> Iterator[SparkCluster]:
    """A master on 127.0.0.1 and `workers` 1-core workers of `memory_mb` each, one per
    address of `worker_hosts(workers)`."""
    from millstream.embedded import free_port

    work.mkdir(parents=True, exist_ok=True)

    env = spark_env(
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",  # no fixed REST port (6066)
        SPARK_WORKER_DIR=str(work / "work"),
        SPARK_DAEMON_MEMORY="384m",
        PYTHONPATH=os.pathsep.join(p for p in (*pythonpath, os.environ.get("PYTHONPATH")) if p),
    )
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []

    def daemon(name: str, args: list[str], host: str) -> tuple[Path, subprocess.Popen[bytes]]:
        log = work / f"{name}.log"
        handle = log.open("wb")
        logs.append(handle)
        proc = subprocess.Popen(
            [spark_class, *args],
            env={**env, "SPARK_LOCAL_IP": host},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: executors go with it
        )
        procs.append(proc)
        return log, proc

    master_log, _ = daemon(
        "master",
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        "127.0.0.1",
    )
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", work / "work")
    try:
        wait_for_log(master_log, "I have been elected leader", 1, 60, procs)
        hosts = worker_hosts(workers)
        for host in hosts:
            _, worker = daemon(
                f"worker-{host}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host,
                    "--cores",
                    "1",
                    "--memory",
                    f"{memory_mb}m",
                    "--webui-port",
                    str(free_port()),
                    cluster.master,
                ],
                host,
            )
            cluster.workers[host] = worker
        wait_for_log(master_log, "Registering worker", len(hosts), 60, procs)
        yield cluster
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for handle in logs:
            handle.close()
