"""One contract suite, run against each Redis deployment shape (single node and Cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from millstream.state.client import connect


@pytest.fixture(params=["single", "cluster"])
def store_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "single":
        url = request.getfixturevalue("redis_url")
    else:
        url = request.getfixturevalue("redis_cluster").url
    client = connect(url, cached=False)
    yield client
    client.close()
