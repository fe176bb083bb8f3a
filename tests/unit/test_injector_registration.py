"""Registering the injectors skips Spark's Python-path scan only where Spark keeps its registry."""

from __future__ import annotations

from millstream.injectors import _skip_static_source_lookup


def test_a_spark_without_the_static_source_registry_is_left_to_scan() -> None:
    class NoJvm:
        sparkContext = None

    assert _skip_static_source_lookup(NoJvm()) is False


def test_the_injector_modules_load_no_clients() -> None:
    """Spark imports the injector modules in the workers that only create the data source
    and plan its reads: they must not load the Kafka or Redis clients, Arrow or numpy (about
    70 MB a process, measured). A fresh interpreter, so that no other test's import counts."""
    import subprocess
    import sys

    code = (
        "import sys, millstream.injectors.kafka, millstream.injectors.logfile\n"
        "from millstream.injectors.kafka import KafkaInjector\n"
        "from millstream.injectors.logfile import LogFileInjector\n"
        "heavy = ('redis', 'confluent_kafka', 'pyarrow', 'numpy', 'pandas')\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == []
