"""`connectors/python_workers.py`: Spark's Python processes import the installed pyspark."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyspark
import pytest

from millstream.connectors import python_workers

_SPARK_LIB = Path(pyspark.__file__).parent / "python" / "lib"
pytestmark = pytest.mark.skipif(
    not (_SPARK_LIB / "pyspark.zip").is_file(), reason="pyspark is not a pip install"
)


def _spark_path() -> str:
    """The PYTHONPATH Spark gives its Python processes: its zips first, then the user's."""
    zips = [str(_SPARK_LIB / "pyspark.zip"), *map(str, sorted(_SPARK_LIB.glob("py4j-*.zip")))]
    return os.pathsep.join([*zips, "/a/user/folder"])


def _imports(python: str) -> tuple[str, str, list[str]]:
    """pyspark's and py4j's files as `python` imports them under Spark's path, and its path."""
    out = subprocess.run(
        [python, "-c", "import json, sys, pyspark, py4j;"
         "print(json.dumps([pyspark.__file__, py4j.__file__, sys.path]))"],
        env={**os.environ, "PYTHONPATH": _spark_path()},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout  # fmt: skip
    pyspark_file, py4j_file, path = json.loads(out)
    return pyspark_file, py4j_file, path


def test_the_launcher_imports_pyspark_and_py4j_from_the_install(tmp_path: Path) -> None:
    python = python_workers.launcher(tmp_path)
    assert python is not None
    pyspark_file, py4j_file, path = _imports(python)
    links = tmp_path / "packages"
    assert Path(pyspark_file).parent == links / "pyspark"
    assert Path(py4j_file).parent == links / "py4j"
    # compiled at install: the imports read bytecode, not the zip's source
    assert Path(pyspark_file).resolve().parent == Path(pyspark.__file__).resolve().parent
    # the links come first; Spark's zips and the user's folder follow, in their order
    spark = _spark_path().split(os.pathsep)
    start = path.index(str(links))
    assert path[start : start + 1 + len(spark)] == [str(links), *spark]
    assert all(p in ("", str(links)) for p in path[: start + 1])


def test_without_the_launcher_spark_would_import_from_the_zip() -> None:
    """What the launcher changes (the test above would pass on its own otherwise)."""
    import sys

    pyspark_file, _, _ = _imports(sys.executable)
    assert "pyspark.zip" in pyspark_file


def test_the_launcher_is_rewritten_when_stale(tmp_path: Path) -> None:
    (tmp_path / "packages").mkdir()
    (tmp_path / "packages" / "pyspark").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "python").write_text("#!/bin/sh\nexit 3\n")
    python = python_workers.launcher(tmp_path)
    assert python == python_workers.launcher(tmp_path)  # idempotent
    assert python is not None and os.access(python, os.X_OK)
    assert Path(_imports(python)[0]).parent == tmp_path / "packages" / "pyspark"


def test_no_launcher_for_a_spark_home_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(python_workers, "_package_dir", lambda name: tmp_path / name)
    assert python_workers.launcher(tmp_path / "launcher") is None
    assert not (tmp_path / "launcher").exists()


def test_a_users_pyspark_python_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/their/python")
    python_workers.default_worker_python()
    assert os.environ["PYSPARK_PYTHON"] == "/opt/their/python"
    monkeypatch.delenv("PYSPARK_PYTHON")
    python_workers.default_worker_python()
    assert os.environ["PYSPARK_PYTHON"].endswith("/python")
    assert "millstream-python-" in os.environ["PYSPARK_PYTHON"]
