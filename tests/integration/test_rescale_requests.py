"""A rescale request's way from `millstream rescale` to the driver (`connectors/rescaling.py`),
on a real Redis: the driver applies it between batches and the stage runs the new layout (a
join's too); a request it cannot apply is refused with a reason the command prints; a start
takes the recorded layout whatever count the configuration names."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from millstream import Computation, Context, Record, Topology, json_field, kafka_source
from millstream.connectors.rescaling import apply_rescales, take_layouts
from millstream.connectors.stage_plan import Stage
from millstream.errors import ConfigurationError
from millstream.rescale_tool import rescale
from millstream.state.client import connect
from millstream.state.shard import ShardConfig
from millstream.state.shard_count import (
    ShardLayout,
    pending_rescales,
    read_layout,
    request_rescale,
    rescale_reports_key,
)


class Keep(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(ctx.get_state(0) + 1)


def _stages(app: str, shards: int = 4) -> dict[str, Stage]:
    topology = Topology(app)
    topology.source("clicks", kafka_source("clicks"))
    topology.source("queries", kafka_source("queries"))
    topology.join(
        "joiner", primary="clicks", primary_id=json_field("id"), secondary="queries",
        secondary_id=json_field("id"), lookup=json_field("query"),
        combine=lambda click, query: {"click": click}, output="joined", shards=shards,
    )  # fmt: skip
    topology.computation("counter", Keep(), inputs={"clicks": json_field("k")}, shards=shards)
    return {
        name: Stage(topology.computations[name], shards, ShardConfig(), f"m-{name}")
        for name in ("joiner", "counter")
    }


@pytest.fixture
def client(redis_url: str) -> Any:
    made = connect(redis_url, cached=False)
    yield made
    made.close()


def test_the_driver_applies_requests_between_batches(client: Any, redis_namespace: str) -> None:
    """Two commands wait while the driver moves both computations, a join among them; a
    request for the count a computation already has is refused with a reason printed."""
    app = redis_namespace
    stages = _stages(app)
    take_layouts(client, app, stages)
    said: list[str] = []
    outcomes: dict[str, int] = {}

    def ask(name: str, shards: int) -> None:
        outcomes[name] = rescale(client, app, name, shards, 20.0, True, said.append)

    commands = [
        threading.Thread(target=ask, args=("counter", 8)),
        threading.Thread(target=ask, args=("joiner", 2)),
    ]
    for command in commands:
        command.start()
    deadline = time.monotonic() + 20
    while len(pending_rescales(client, app)) < 2:
        assert time.monotonic() < deadline, said
        time.sleep(0.05)
    assert sorted(apply_rescales(client, app, stages)) == ["counter", "joiner"]
    for command in commands:
        command.join(30)
    assert outcomes == {"counter": 0, "joiner": 0}, said
    assert (stages["counter"].shards, stages["counter"].generation) == (8, 1)
    assert (stages["joiner"].shards, stages["joiner"].generation) == (2, 1)
    assert read_layout(client, app, "counter") == ShardLayout(8, 1)
    assert read_layout(client, app, "joiner") == ShardLayout(2, 1)
    assert pending_rescales(client, app) == {}
    assert any("rescaled counter" in line for line in said), said
    # Asked for the count it has (a request the command did not filter): refused, reported.
    request_rescale(client, app, "joiner", 2)
    assert apply_rescales(client, app, stages) == []
    assert pending_rescales(client, app) == {}
    assert "already runs with 2 shards" in client.hget(rescale_reports_key(app), "joiner").decode()
    # A restart configured with 4 shards runs the 8 the rescale wrote; a count changed in the
    # configuration of a computation never rescaled still stops the start, naming the command.
    restarted = _stages(app)
    take_layouts(client, app, {"counter": restarted["counter"]})
    assert restarted["counter"].shards == 8
    fresh = _stages(f"{app}-b")
    take_layouts(client, f"{app}-b", fresh)
    with pytest.raises(ConfigurationError, match="millstream rescale"):
        take_layouts(client, f"{app}-b", {"joiner": _stages(f"{app}-b", shards=6)["joiner"]})


def test_a_request_for_a_stopped_application_waits_for_its_next_start(
    client: Any, redis_namespace: str
) -> None:
    app = redis_namespace
    stages = _stages(app)
    take_layouts(client, app, stages)
    said: list[str] = []
    assert rescale(client, app, "counter", 2, 5.0, False, said.append) == 0
    assert "next `millstream run` moves the keys" in said[-1]
    assert pending_rescales(client, app) == {"counter": 2}
    assert read_layout(client, app, "counter") == ShardLayout(4, 0)  # nothing moved yet
    assert rescale(client, app, "counter", 4, 5.0, False, said.append) == 0  # the count it has
    assert "the request for 2 shards, not applied yet, is withdrawn" in said[-1]
    assert pending_rescales(client, app) == {}
    assert rescale(client, app, "counter", 4, 5.0, False, said.append) == 0
    assert "nothing to do" in said[-1]
    with pytest.raises(ConfigurationError, match="no computation 'nope'"):
        rescale(client, app, "nope", 2, 5.0, False, said.append)
    with pytest.raises(ConfigurationError, match="between 1 and 4096"):
        request_rescale(client, app, "counter", 0)
