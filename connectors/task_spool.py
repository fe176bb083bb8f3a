"""A shard job's payloads and results through local files when Spark runs on this machine.

`parallelize` and `collect` carry a shard job's data through the driver JVM: each task's
payload as the RDD's data, again inside the serialized task and again in the task the executor
deserializes, and each task's results on the way back. A 20,000-record batch's copies outlive
the young collections that meet them, overflow the survivor spaces and are promoted, so the
old generation fills with dead batches and its pages stay resident: the JVM of the bench's
throughput process grew from 411 to 526 MB over its life (`jcmd GC.heap_info`).

With a local master (`local`, `local[n]`, `local-cluster[...]`) the Python workers share the
driver's file system: the driver writes each task's payload to a file in this process's spool
folder and the JVM carries only its path; the task writes its results to a file beside it and
returns that path. The files live for one job: the driver removes them once it has read the
results, or the job failed. The folder is this process's alone (`mkdtemp`, named after its
pid) and goes at exit; one left by a process that was killed goes when the next spool
starts. Any other master keeps the JVM path, whose executors may be other machines.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

PREFIX = "millstream-spool-"


def local_master(master: str) -> bool:
    """Whether Spark's executors run on this machine (their Python workers see our files)."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_stale(root: Path) -> None:
    """Remove the spool folders of processes that are gone (killed before they cleaned up)."""
    for folder in root.glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


class Spool:
    """This process's spool folder: a file per task payload and per task result."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.gettempdir())
        self.folder = self.root  # made on first use: mkdtemp's, this process's alone
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._ready = False

    def _prepare(self) -> Path:
        """This process's folder, made on first use, and again if something removed it (a
        temporary-files cleaner, after a long quiet spell)."""
        with self._lock:
            if not self._ready:
                remove_stale(self.root)
            if not self._ready or not self.folder.is_dir():
                self.root.mkdir(parents=True, exist_ok=True)
                self.folder = Path(
                    tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.root)
                )
                atexit.register(shutil.rmtree, self.folder, ignore_errors=True)
                self._ready = True
            return self.folder

    @contextlib.contextmanager
    def job(self, payloads: Iterable[bytes]) -> Iterator[list[str]]:
        """A file per payload, their paths for one job's tasks; afterwards every file of the
        job is removed (its payloads and whatever results its task attempts wrote), whether
        the job succeeded, failed, or failed while its payloads were being written."""
        folder = self._prepare()
        paths: list[str] = []
        try:
            for payload in payloads:
                with self._lock:
                    path = str(folder / f"{next(self._names)}.in")
                paths.append(path)
                Path(path).write_bytes(payload)
            yield paths
        finally:
            for path in paths:
                for name in (path, *glob.glob(f"{glob.escape(_stem(path))}.*.out*")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name)


def _stem(payload_path: str) -> str:
    return payload_path[: -len(".in")]


def read_payload(path: str) -> bytes:
    """Executor side: a payload the driver spooled."""
    return Path(path).read_bytes()


def write_results(payload_path: str, results: bytes) -> str:
    """Executor side: the task's results, beside its payload; the path goes back to the
    driver. Each attempt writes a file of its own (a retried or speculative attempt of the
    same task must not overwrite the results of the attempt Spark accepts), under a temporary
    name renamed when whole."""
    final = f"{_stem(payload_path)}.{uuid.uuid4().hex}.out"
    partial = f"{final}.part"
    Path(partial).write_bytes(results)
    os.replace(partial, final)
    return final


def take_results(path: str) -> bytes:
    """Driver side: a task's results, read and removed."""
    data = Path(path).read_bytes()
    os.unlink(path)
    return data
