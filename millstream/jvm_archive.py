"""A class-data-sharing archive of the classes Spark's driver JVM loads, built once per install.

Starting a Spark driver spends most of its time loading and verifying the classes of Spark's
jars: on this 2-core machine `SparkSession.getOrCreate()` took 10.4 s, 5.9 s with the classes
mapped from an AppCDS archive (Java's class-data sharing, JDK 13+). Every `millstream run`, a
restart after a crash included, starts that much sooner.

The archive is tied to one Java and one set of Spark jars; its file name is a key of both, so a
new JDK or PySpark simply looks for (and `make setup` builds) another. The name also carries the
PySpark install it serves, so two virtualenvs on one machine do not delete each other's. A truncated archive
crashes the JVM that maps it (SIGBUS), so one is only ever used from its final name, which it
gets by an atomic rename after the JVM that wrote it exited cleanly and a second JVM started
with it (`-Xshare:on`: that start fails instead of ignoring an archive it cannot use).
MILLSTREAM_JVM_ARCHIVE=off starts without it.

`python -m millstream.jvm_archive` builds it (`make setup` runs that); nothing builds it
implicitly, since writing one takes a JVM run of about half a minute.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The JVM's own notes about the archive (a mismatch after a user adds jars, for example) are
# not the user's concern: the JVM then loads classes the usual way.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# What `_warm` runs is part of the key: a new workload is a new archive, built by `make setup`.
WORKLOAD = "2: Python streaming source, checkpoint restart"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "millstream" / "jvm"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return Path(home, "bin", "java").resolve()
    found = shutil.which("java")
    return Path(found).resolve() if found else None


def archive_key() -> str | None:
    """A digest of the Java install and Spark's jars; None when either cannot be found."""
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir():
        return None
    facts = [str(java), pyspark.__version__, str(jars), WORKLOAD]
    modules = java.parent.parent / "lib" / "modules"  # the JDK's class image: new on any update
    for path in (java, modules):
        if path.exists():
            stat = path.stat()
            facts.append(f"{path}:{stat.st_size}:{int(stat.st_mtime)}")
    facts.extend(sorted(p.name for p in jars.glob("*.jar")))
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]


def _install() -> str:
    """A short digest of where PySpark is installed: two virtualenvs on one machine each keep
    their own archive (a rebuild in one must not delete the other's)."""
    import pyspark

    return hashlib.sha256(str(Path(pyspark.__file__).parent).encode()).hexdigest()[:8]


def archive_path() -> Path | None:
    key = archive_key()
    return None if key is None else cache_dir() / f"spark-driver-{_install()}-{key}.jsa"


def java_options(enabled: bool = True) -> list[str]:
    """Driver JVM options that map the archive, when it is enabled and has been built."""
    path = archive_path() if enabled else None
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", *QUIET]


def _session(java_options: str) -> object:
    from pyspark.sql import SparkSession

    from millstream.connectors import python_workers
    from millstream.connectors.spark_session import LOCAL_CHECKPOINTS

    python_workers.default_worker_python()
    return (
        SparkSession.builder.master("local[2]")
        .appName("millstream.jvm-archive")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINTS)
        .getOrCreate()
    )


def _counting_source() -> Any:
    """A Python streaming source of consecutive numbers: the JVM classes of a Python data
    source (its runner, planner and readers) are what a pipeline's first batch loads."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        InputPartition,
        ReadAllAvailable,
    )

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"n": 0}

        def getDefaultReadLimit(self) -> Any:
            return ReadAllAvailable()

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"n": start["n"] + 5}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition((start["n"], end["n"]))]

        def read(self, partition: Any) -> Any:
            low, high = partition.value
            return ((n,) for n in range(low, high))

    class Counting(DataSource):
        @classmethod
        def name(cls) -> str:
            return "millstream-jvm-warm"

        def schema(self) -> str:
            return "n long"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

    return Counting


def _warm(archive: str) -> None:
    """Child process: load what a pipeline's driver loads (a session, the injectors, a
    streaming query on a Python source with foreachBatch and its checkpoint files, an Arrow
    collection, the query's restart from its checkpoint), then exit so the JVM writes."""
    from millstream.injectors import register

    spark: Any = _session(f"-XX:ArchiveClassesAtExit={archive} {' '.join(QUIET)}")
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    source = _counting_source()
    spark.dataSource.register(source)
    spark.range(100).toArrow()
    seen: list[int] = []

    def batch(frame: Any, batch_id: int) -> None:
        seen.append(frame.toArrow().num_rows if batch_id % 2 == 0 else batch_id)

    with tempfile.TemporaryDirectory() as checkpoint:
        for runs in (3, 5):  # the second start recovers from the checkpoint
            query = (
                spark.readStream.format(source.name())
                .load()
                .writeStream.foreachBatch(batch)
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="200 milliseconds")
                .start()
            )
            deadline = time.monotonic() + 60
            while len(seen) < runs and time.monotonic() < deadline:
                time.sleep(0.1)
            query.stop()
    spark.stop()


def _check(archive: str) -> None:
    """Child process: a JVM that must map the archive to start at all."""
    spark = _session(f"-Xshare:on -XX:SharedArchiveFile={archive} {' '.join(QUIET)}")
    assert spark.range(3).count() == 3  # type: ignore[attr-defined]
    spark.stop()  # type: ignore[attr-defined]


def build(force: bool = False) -> Path:
    """Build the archive for this Java and PySpark unless it exists; returns its path."""
    path = archive_path()
    if path is None:
        raise RuntimeError("no Java or no PySpark jars found: nothing to build an archive for")
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    try:
        for step in ("warm", "check"):
            done = subprocess.run(
                [sys.executable, "-m", "millstream.jvm_archive", f"--{step}", str(temporary)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0 or not temporary.is_file():
                raise RuntimeError(
                    f"building the JVM archive failed at its {step} step "
                    f"(exit {done.returncode}): {done.stderr[-2000:]}"
                )
        temporary.replace(path)  # atomic: a start-up sees no archive or a whole one
    finally:
        temporary.unlink(missing_ok=True)
    ours = path.parent.glob(f"spark-driver-{_install()}-*.jsa")
    unnamed = path.parent.glob("spark-driver-" + "?" * 16 + ".jsa")  # before installs had names
    for stale in [*ours, *unnamed]:
        if stale != path:  # this install's previous Java or PySpark: never used again
            stale.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] in ("--warm", "--check"):
        (_warm if args[0] == "--warm" else _check)(args[1])
        return 0
    force = args == ["--force"]
    if args and not force:
        print("usage: python -m millstream.jvm_archive [--force]", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        existing = archive_path()
        fresh = force or existing is None or not existing.is_file()
        path = build(force)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"JVM class archive not built ({exc}); Spark starts without it, a few s slower")
        return 1
    what = f"built in {time.monotonic() - started:.0f} s" if fresh else "present"
    print(f"JVM class archive {what}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
