"""The driver's SparkSession: how millstream runs Spark, and why each setting.

Built once per process by `run` (a standby builds it while it waits, for a quick takeover), by
the bench and by the tests' shared session, which take the checkpoint manager and the worker
daemon from here so that they run Spark as `run` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from millstream.connectors import memory, python_workers
from millstream.connectors.driver_read import local_folder
from millstream.logs import spark_log_config, spark_log_level
from millstream.settings import Settings

# Spark writes two checkpoint files per micro-batch (its offset and commit logs). Its default
# manager renames them through Hadoop's FileContext, which on a local disk asks `readlink` in a
# child process for each file and its checksum: 62 ms per write measured on 2 cores, 17 ms
# through the FileSystem API, whose rename of a local file is one atomic rename(2).
LOCAL_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
# Spark's Python worker daemon, with the shard task's modules imported before it forks a
# worker (`millstream/worker_daemon.py`): a burst after a quiet minute meets warm workers.
WORKER_DAEMON = "millstream.worker_daemon"


def checkpoint_config(checkpoint_dir: str) -> dict[str, str]:
    """The checkpoint file manager for a checkpoint folder on the local disk; a distributed
    file system (hdfs:, s3a:, ...) keeps Spark's default, whose rename is atomic there."""
    if local_folder(checkpoint_dir) is None:
        return {}
    return {"spark.sql.streaming.checkpointFileManagerClass": LOCAL_CHECKPOINTS}


def driver_java_options(settings: Settings, log_options: str, archive: Sequence[str]) -> str:
    """The driver JVM's options: logging's, MILLSTREAM_DRIVER_JAVA_OPTIONS and the class
    archive's, in that order (a later option of the same name wins in the JVM)."""
    return " ".join(o for o in (log_options, *settings.driver_java_options, *archive) if o)


def spark_session(settings: Settings, app_name: str) -> Any:
    """A SparkSession whose Python workers run this interpreter (so they see our packages)."""
    from millstream.embedded import check_java

    check_java()
    memory.cap_arenas()
    python_workers.default_worker_python(Path(settings.state_dir) / "python")
    from pyspark.sql import SparkSession

    from millstream import jvm_archive  # not at import: `python -m` runs it as a script

    config = dict(spark_log_config(settings.log_level))
    config.update(checkpoint_config(settings.checkpoint_dir))
    java_options = driver_java_options(
        settings,
        str(config.pop("spark.driver.extraJavaOptions", "") or ""),
        jvm_archive.java_options(settings.jvm_archive == "auto"),
    )
    if java_options:
        config["spark.driver.extraJavaOptions"] = java_options
    spark = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.scheduler.mode", "FAIR")  # queries added at run time interleave jobs
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", WORKER_DAEMON)
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .config("spark.driver.memory", settings.spark_driver_memory)
        # A Python worker on a saturated machine may take longer than the default 15 s to
        # connect back to the JVM; that failed whole queries under load. Wait longer.
        .config("spark.python.authenticate.socketTimeout", "60s")
        # Options such as redis.url may carry a password: keep them out of Spark's logs and UI.
        .config("spark.redaction.regex", r"(?i)secret|password|token|access[.]?key|url")
        .config(map=config)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(spark_log_level(settings.log_level))
    from millstream.injectors import register

    register(spark)
    return spark
