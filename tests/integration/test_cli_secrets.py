"""A password in REDIS_URL never reaches the output of a failed connection.

`test_cli_errors.py` covers a working `millstream status` and a rejected password; this covers
the "unreachable" path, for a password in the user part and for one in the query string
(`?password=`, which redis-py also accepts), with the rest of the URL left readable.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_cli_errors import assert_one_line_error, millstream
from tests.secrets import MARKER, secret


def test_unreachable_redis_with_a_password_in_the_url_is_masked(tmp_path: Path) -> None:
    password = secret("unreachable")
    url = f"redis://millstream:{password}@127.0.0.1:1/0"
    result = millstream(["status"], {"REDIS_URL": url}, tmp_path)
    line = assert_one_line_error(result, "redis://millstream:***@127.0.0.1:1/0 is unreachable")
    assert MARKER not in line + result.stdout


def test_password_in_the_query_is_masked_and_the_ca_path_kept(tmp_path: Path) -> None:
    password = secret("query")
    ca = tmp_path / "ca.pem"
    url = f"rediss://127.0.0.1:1/0?password={password}&ssl_ca_certs={ca}"
    result = millstream(["status"], {"REDIS_URL": url}, tmp_path)
    line = assert_one_line_error(
        result, f"rediss://127.0.0.1:1/0?password=***&ssl_ca_certs={ca}", "is unreachable"
    )
    assert MARKER not in line + result.stdout
