"""`millstream/worker_daemon.py`: Spark's worker daemon imports the shard task before forking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

_PROBE = """
import json, os, sys
from millstream import worker_daemon
before = "millstream.connectors.shard_task" in sys.modules
if len(sys.argv) > 2:
    worker_daemon.PRELOADED = (sys.argv[2],)
worker_daemon.preload(sys.argv[1] or None)
print(json.dumps({
    "before": before,
    "after": "millstream.connectors.shard_task" in sys.modules,
    "threads": len(os.listdir("/proc/self/task")),
    "openblas": os.environ.get("OPENBLAS_NUM_THREADS"),
}))
"""


def _probe(*args: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**environment, **(env or {})},
        timeout=60,
    )
    return json.loads(done.stdout), done.stderr


def test_the_plain_worker_daemon_imports_the_shard_task_without_starting_a_thread() -> None:
    found, _ = _probe("pyspark.worker")
    # A forked child keeps only the forking thread: the daemon must have no other.
    assert found == {"before": False, "after": True, "threads": 1, "openblas": "1"}
    found, _ = _probe("")  # Spark's default worker module, not named
    assert found["after"] and found["threads"] == 1


def test_a_users_openblas_setting_is_kept() -> None:
    found, _ = _probe("pyspark.worker", env={"OPENBLAS_NUM_THREADS": "4"})
    assert found["after"] and found["openblas"] == "4"


def test_daemons_of_other_workers_import_nothing() -> None:
    found, _ = _probe("pyspark.sql.worker.create_data_source")
    assert found == {"before": False, "after": False, "threads": 1, "openblas": None}


def test_a_failed_preload_is_reported_and_the_daemon_goes_on() -> None:
    found, stderr = _probe("pyspark.worker", "millstream.no_such_module")
    assert not found["after"]
    assert "could not preload the runtime" in stderr and "no_such_module" in stderr


_FREEZE_PROBE = """
import gc, json, sys
import pyspark.daemon
from millstream import worker_daemon
pyspark.daemon.manager = lambda: print(json.dumps(
    {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}
))
sys.argv = ["worker_daemon", "pyspark.worker"]
worker_daemon.main()
"""


def test_the_daemon_freezes_its_heap_before_it_forks_workers() -> None:
    """Spark's daemon collects garbage in a worker after every task: what the daemon holds
    (the preloaded runtime, pyspark) is frozen, so those collections skip it."""
    done = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE], capture_output=True, text=True, check=True,
        timeout=60,
    )  # fmt: skip
    found = json.loads(done.stdout)
    assert found["frozen"] > 20_000 and found["tracked"] < found["frozen"] // 20, found


def test_the_daemon_takes_sparks_core_jar_off_the_path(tmp_path: Path) -> None:
    """Spark puts its core jar on the workers' PYTHONPATH; every fresh worker's first task
    would read the jar's directory again. The daemon drops it, and only it, before forking."""
    jar = tmp_path / "jars" / "spark-core_2.13-4.3.0.jar"
    other = tmp_path / "jars" / "user-code.jar"
    jar.parent.mkdir()
    for path in (jar, other):
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("org/apache/spark/Nothing.class", b"\\xca\\xfe")
    probe = """
import json, sys
import pyspark.daemon
from millstream import worker_daemon
try:
    import no_such_module_anywhere  # the import fills the importer cache for every path entry
except ImportError:
    pass
cached = [p for p in sys.path_importer_cache if p.endswith(".jar")]
pyspark.daemon.manager = lambda: print(json.dumps({
    "cached_before": cached,
    "path": [p for p in sys.path if p.endswith(".jar")],
    "cache": [p for p in sys.path_importer_cache if p.endswith(".jar")],
}))
sys.argv = ["worker_daemon", "pyspark.sql.worker.create_data_source"]
worker_daemon.main()
"""
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": f"{jar}{os.pathsep}{other}"},
        timeout=60,
    )
    found = json.loads(done.stdout)
    assert str(jar) in found["cached_before"], found  # the probe did fill the cache
    assert found["path"] == [str(other)] and found["cache"] == [str(other)], found
