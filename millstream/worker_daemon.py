"""Spark's Python worker daemon with the shard task's modules imported before it forks.

Spark runs Python tasks in workers that its daemon (`pyspark.daemon`) forks, and it stops
every pooled worker once no Python task has run for a minute (a fixed timeout in Spark's
`PythonWorkerFactory`). A fresh worker imported the shard task's modules (redis,
confluent-kafka, numpy, msgspec, mmh3, the runtime: 0.35 s of CPU on a quiet 2-core machine,
more on a busy one) before its first shard ran. Imported here once, in the daemon, every forked
worker starts with them: a job in fresh workers took 0.30 s instead of 0.64 s (a warm one
0.08-0.17 s). `connectors/shard_jobs.WarmWorkers` keeps the workers from going at all.

Spark names this module in `spark.python.daemon.module` (`connectors/app.py`) and passes the
worker module as the first argument. Only the plain worker (`pyspark.worker`, which runs the
shard tasks) gets the imports: Spark starts daemons of its own for data source planning, whose
workers never run a shard. The daemon must not start a thread before it forks (a forked child
keeps only the forking thread): numpy's OpenBLAS starts one at import unless told to use one,
so this sets OPENBLAS_NUM_THREADS=1 (the runtime uses no BLAS routine) unless the user set it.
A failed import is written to stderr and the daemon runs as Spark's own would.

Then every daemon freezes its heap (`gc.freeze`): Spark's daemon runs a full `gc.collect()` in a
reused worker after every task, and with the imports above that walked about 58,000 objects
inherited from the daemon, 25 ms a task on a quiet machine (py-spy at 5,000 ev/s: 17-20% of
each worker's CPU). Frozen objects are never scanned, so a worker's collection walks only what
it allocated itself; nothing frozen is garbage (modules, classes, functions), and frozen pages
stay shared with the daemon instead of being written by every worker's collections.

Spark also puts its `spark-core` jar on the workers' PYTHONPATH (a relic of the days when
pyspark travelled inside it; it holds no Python). A fresh worker's first task adds Spark's files
folder to `sys.path` and calls `importlib.invalidate_caches()`, which makes the jar's zip
importer read its directory of some 10,000 entries again: 24 ms on a quiet machine, 140 ms on
a loaded one, for every worker Spark starts (after a restart, or after its idle timeout). The
daemon takes the jar off `sys.path` and out of the importer cache before it forks.
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import sys
import traceback

# What a shard task imports: the runtime's modules, and through them redis, confluent-kafka,
# numpy, msgspec and mmh3.
PRELOADED = ("millstream.connectors.shard_jobs", "millstream.connectors.combiners")
PLAIN_WORKER = "pyspark.worker"
SPARK_CORE_JAR = re.compile(r"spark-core_[^/]*\.jar$")


def preload(worker_module: str | None) -> None:
    """Import the shard task's modules when this daemon forks plain workers."""
    if worker_module not in (None, PLAIN_WORKER):
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        for name in PRELOADED:
            importlib.import_module(name)
    except Exception:  # the workers import what they need themselves, as before
        sys.stderr.write("millstream: the worker daemon could not preload the runtime:\n")
        traceback.print_exc(file=sys.stderr)


def drop_spark_jar() -> None:
    """Take Spark's core jar off `sys.path` and out of the importer cache (module docstring)."""
    sys.path[:] = [p for p in sys.path if not SPARK_CORE_JAR.search(p)]
    for path in [p for p in sys.path_importer_cache if SPARK_CORE_JAR.search(p)]:
        del sys.path_importer_cache[path]


def main() -> None:
    drop_spark_jar()
    preload(sys.argv[1] if len(sys.argv) > 1 else None)
    from pyspark.daemon import manager

    gc.collect()  # the imports' own garbage, so that none of it is frozen
    gc.freeze()
    manager()


if __name__ == "__main__":
    main()
