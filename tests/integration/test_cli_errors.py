"""The installed `millstream` console script, as a user runs it, with bad configuration.

Every mistake must end in ONE line on stderr that names the cause (`millstream: error: ...`),
no traceback, nothing on stdout, and a non-zero exit. Secrets never appear in any output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import redis

from millstream.embedded import RedisService, start_redis
from tests.secrets import secret

SCRIPT = Path(sys.executable).with_name("millstream")
TIMEOUT = 120


def _command() -> list[str]:
    """The console script installed next to this interpreter, else the module it runs."""
    if SCRIPT.exists():
        return [str(SCRIPT)]
    return [sys.executable, "-m", "millstream.cli"]


def _clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MILLSTREAM_") and k not in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")
    }
    env.update(extra)
    return env


def millstream(
    args: list[str], env: Mapping[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_command(), *args],
        env=_clean_env(env),
        cwd=cwd,  # `run` imports from the working folder; `status` looks for .millstream there
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *causes: str) -> str:
    err = result.stderr
    assert result.returncode != 0, (result.returncode, result.stdout, err)
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"expected one line, got:\n{err}"
    assert err.startswith("millstream: error: "), err
    for cause in causes:
        assert cause in err, err
    assert result.stdout == "", result.stdout
    return err.strip()


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("argv", [["status"], ["run", "myapp.pipeline:topology"]])
@pytest.mark.parametrize(
    ("env", "causes"),
    [
        pytest.param(
            {"REDIS_URL": "http://x"},
            ("REDIS_URL='http://x' is invalid", "redis://localhost:6379/0"),
            id="malformed-redis-url",
        ),
        pytest.param(
            {"MILLSTREAM_SHRADS": "4"},
            ("unknown variable MILLSTREAM_SHRADS", "configuration table"),
            id="unknown-variable",
        ),
        pytest.param(
            {"MILLSTREAM_SHARDS": "0"},
            ("MILLSTREAM_SHARDS='0' is invalid", "an integer 1-4096"),
            id="bad-value",
        ),
    ],
)
def test_bad_configuration_is_one_line(
    argv: list[str], env: dict[str, str], causes: tuple[str, ...], tmp_path: Path
) -> None:
    result = millstream(argv, env, tmp_path)
    assert_one_line_error(result, *causes)
    assert result.returncode == 2


def test_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    result = millstream(["status"], {"REDIS_URL": "redis://127.0.0.1:1/0"}, tmp_path)
    assert_one_line_error(result, "redis://127.0.0.1:1/0 is unreachable", "REDIS_URL")


def test_status_without_any_redis_is_one_line(tmp_path: Path) -> None:
    result = millstream(["status"], {}, tmp_path)
    assert_one_line_error(result, "REDIS_URL is not set", "millstream infra up")


def test_run_unknown_module_is_one_line(tmp_path: Path) -> None:
    result = millstream(["run", "nosuchmodule:topology"], {}, tmp_path)
    assert_one_line_error(result, "cannot import 'nosuchmodule'", "No module named")


def test_run_missing_attribute_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "mypipeline.py").write_text("x = 1\n")
    result = millstream(["run", "mypipeline:topology"], {}, tmp_path)
    assert_one_line_error(result, "module 'mypipeline' has no attribute 'topology'")


def test_run_attribute_that_is_not_a_topology_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "mypipeline.py").write_text("topology = 42\n")
    result = millstream(["run", "mypipeline:topology"], {}, tmp_path)
    assert_one_line_error(result, "mypipeline:topology is a int, expected a Topology")


PIPELINE = """
from millstream import Computation, Topology, kafka_source


class Count(Computation):
    def process_record(self, ctx, record):
        ctx.set_state(ctx.get_state(0) + 1)


topology = Topology("onepipe")
topology.source("input", kafka_source("onepipe-input"))
topology.computation("count", Count(), inputs=["input"])
"""


@pytest.mark.parametrize(
    ("env", "unset", "still_set"),
    [
        ({}, "REDIS_URL and KAFKA_BOOTSTRAP_SERVERS are not set", None),
        ({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}, "REDIS_URL is not set", "KAFKA_BOOTSTRAP"),
    ],
)
def test_run_without_redis_url_stops_before_starting_anything(
    env: dict[str, str], unset: str, still_set: str | None, tmp_path: Path
) -> None:
    """No silent throw-away Redis: a valid pipeline, no REDIS_URL, no --embedded."""
    (tmp_path / "onepipe.py").write_text(PIPELINE)
    result = millstream(["run", "onepipe:topology"], env, tmp_path)
    err = assert_one_line_error(result, unset, "--embedded", "MILLSTREAM_EMBEDDED=always")
    if still_set:
        assert still_set not in err
    assert not (tmp_path / ".millstream").exists()  # no embedded service, no checkpoint


def test_run_with_a_missing_input_topic_stops_before_spark(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A typo in an input topic is one line naming topic and stream, before any JVM starts:
    the query used to fail four times with Spark's stack traces before the run gave up.

    MILLSTREAM_APP differs from the topology's name on purpose: the run says which one it
    uses (the topology's) and warns that the CLI's tools would look at the other."""
    (tmp_path / "onepipe.py").write_text(PIPELINE)
    env = {
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MILLSTREAM_APP": "elsewhere",
    }
    result = millstream(["run", "onepipe:topology"], env, tmp_path)
    assert result.returncode == 2, result.stderr
    # The warning about the name, the run's INFO line with its settings, then the error, and
    # nothing else.
    warned, settings, err = result.stderr.splitlines()
    assert " WARNING MILLSTREAM_APP=elsewhere is not this run's application" in warned, warned
    assert "the topology names it 'onepipe'" in warned, warned
    assert " INFO settings: " in settings and " app=onepipe " in settings, settings
    assert err.startswith(
        "millstream: error: input topic 'onepipe-input' of stream 'input' "
        f"does not exist on {kafka_bootstrap}"
    ), result.stderr
    assert not (tmp_path / ".millstream" / "checkpoints").exists()  # no query was started


# ---------------------------------------------------------------- a Redis with a password


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[tuple[RedisService, str]]:
    """A private redis-server (never the shared one) whose default user needs a password.

    The password is set after start: `start_redis`'s readiness probe does not authenticate.
    """
    service = start_redis(tmp_path / "password-redis")
    password = secret("cli")
    try:
        admin = redis.Redis(host="127.0.0.1", port=service.port)
        try:
            admin.config_set("requirepass", password)
        finally:
            admin.close()
        yield service, password
    finally:
        service.stop()


def _url(service: RedisService, password: str, user: str = "") -> str:
    return f"redis://{user}:{password}@127.0.0.1:{service.port}/0"


@pytest.mark.parametrize("user", ["", "default"])
def test_status_json_on_a_fresh_app_hides_the_password(
    password_redis: tuple[RedisService, str], user: str, redis_namespace: str, tmp_path: Path
) -> None:
    service, password = password_redis
    env = {"REDIS_URL": _url(service, password, user), "MILLSTREAM_APP": redis_namespace}
    result = millstream(["status", "--json"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["app"] == redis_namespace
    assert snapshot["computations"] == {}
    assert isinstance(snapshot["at"], int)
    assert password not in result.stdout
    assert password not in result.stderr


def test_status_text_on_a_fresh_app(
    password_redis: tuple[RedisService, str], redis_namespace: str, tmp_path: Path
) -> None:
    service, password = password_redis
    env = {"REDIS_URL": _url(service, password), "MILLSTREAM_APP": redis_namespace}
    result = millstream(["status"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"app {redis_namespace!r}: no computation has committed a batch yet\n"
    assert password not in result.stdout + result.stderr


def test_wrong_password_is_one_line_and_masked(
    password_redis: tuple[RedisService, str], tmp_path: Path
) -> None:
    service, password = password_redis
    wrong = secret("wrong")
    result = millstream(["status", "--json"], {"REDIS_URL": _url(service, wrong)}, tmp_path)
    line = assert_one_line_error(
        result, "rejected the credentials", f":***@127.0.0.1:{service.port}"
    )
    assert wrong not in line and password not in line


def test_missing_password_is_one_line(
    password_redis: tuple[RedisService, str], tmp_path: Path
) -> None:
    service, password = password_redis
    url = f"redis://127.0.0.1:{service.port}/0"
    result = millstream(["status", "--json"], {"REDIS_URL": url}, tmp_path)
    line = assert_one_line_error(result, "rejected the credentials", url)
    assert password not in line
