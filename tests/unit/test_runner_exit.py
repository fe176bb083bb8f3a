"""A stream reader's runner process ends quietly when the JVM closes its socket
(injectors/_runner_exit.py), and only then.

Each case runs a child process shaped like Spark's runner (`python_streaming_source_runner`:
its loop's `finally` calls the reader's `stop()`, its handler reports what escapes and exits
-1), with a real reader of each injector.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from millstream.injectors._runner_exit import RUNNER

READERS = {
    "kafka": (
        "from millstream.injectors.kafka import KafkaInjectorOptions, KafkaStreamReader\n"
        "reader = KafkaStreamReader(KafkaInjectorOptions.parse("
        "{'bootstrap.servers': 'localhost:9092', 'topics': 't'}))"
    ),
    "logfile": (
        "from millstream.injectors.logfile import LogFileOptions, LogFileStreamReader\n"
        "reader = LogFileStreamReader(LogFileOptions.from_options("
        "{'path': sys.argv[1], 'stream': 's'}))"
    ),
}


def _run(tmp_path: Path, reader: str, *, runner: bool, error: str | None) -> tuple[int, str, str]:
    main_name = RUNNER if runner else "some.other.program"
    raised = f"raise {error}('socket')" if error else "pass"
    script = textwrap.dedent(
        """
        import sys, types
        sys.modules["__main__"].__spec__ = types.SimpleNamespace(name={main_name!r})
        {reader}
        try:
            try:
                {raised}
            finally:
                reader.stop()
        except BaseException as e:
            print("reported to the JVM:", repr(e), file=sys.stderr)
            sys.exit(-1)
        print("went on")
        """
    ).format(main_name=main_name, reader=READERS[reader], raised=raised)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("reader", sorted(READERS))
def test_the_runner_ends_quietly_when_the_jvm_closed_its_socket(
    tmp_path: Path, reader: str
) -> None:
    code, out, err = _run(tmp_path, reader, runner=True, error="EOFError")
    assert (code, out, err) == (0, "", "")


@pytest.mark.parametrize("reader", sorted(READERS))
def test_any_other_error_still_reaches_the_jvm(tmp_path: Path, reader: str) -> None:
    code, _, err = _run(tmp_path, reader, runner=True, error="RuntimeError")
    assert code == 255 and "reported to the JVM: RuntimeError('socket')" in err, err


def test_outside_spark_runner_an_eof_is_not_swallowed(tmp_path: Path) -> None:
    code, _, err = _run(tmp_path, "kafka", runner=False, error="EOFError")
    assert code == 255 and "reported to the JVM: EOFError('socket')" in err, err


def test_a_stop_without_an_error_returns(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, "logfile", runner=True, error=None)
    assert (code, out.strip()) == (0, "went on"), err
