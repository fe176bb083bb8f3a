"""Issue #17's done-when: a fresh virtualenv outside the repository installs millstream from a
copy of this tree (not editable) plus pytest, and runs the examples' unit tests with
TopologyTestDriver, with no Java on PATH and no Redis or Kafka configured.

Needs the package index (or pip's cache): about 40 s here with a warm cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOT_SHIPPED = (".git", ".venv", "build", ".millstream", "*.egg-info", "__pycache__", "*_cache")
# Not part of the package, and the test suite's own files carry the secret marker that the CI
# run searches its temporary folders for.
NOT_IN_SOURCE = (*NOT_SHIPPED, "tests", "benchmarks", "results")


def _clean_env(venv: Path) -> dict[str, str]:
    """PATH is the venv alone (no java), nothing of millstream's, pip's own settings kept."""
    keep = {"HOME", "LANG", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("PIP_")}
    env["PATH"] = str(venv / "bin")
    return env


def test_a_fresh_venv_runs_the_examples_unit_tests_without_java_or_services(
    tmp_path: Path,
) -> None:
    source = tmp_path / "millstream-src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_IN_SOURCE))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _clean_env(venv)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(source), "pytest"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    project = tmp_path / "project"  # the user's project: the examples, no millstream source
    shutil.copytree(
        ROOT / "examples", project / "examples", ignore=shutil.ignore_patterns(*NOT_SHIPPED)
    )
    probe = subprocess.run(
        [python, "-c", "import shutil, importlib.util as u; print(shutil.which('java'), "
         "u.find_spec('testcontainers'), u.find_spec('millstream').origin)"],
        env=env, cwd=project, capture_output=True, text=True, check=True,
    )  # fmt: skip
    java, testcontainers, origin = probe.stdout.split()
    assert (java, testcontainers) == ("None", "None")
    assert origin.startswith(str(venv)), origin  # the installed copy, not a source folder

    run = subprocess.run(
        [python, "-m", "pytest", "examples", "-q", "-p", "no:cacheprovider"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tests = sum(
        len(re.findall(r"^def test_", path.read_text(), flags=re.M))
        for path in (ROOT / "examples").rglob("test_*.py")
    )
    assert run.returncode == 0 and f"{tests} passed" in run.stdout, run.stdout + run.stderr
