"""`millstream state` and `millstream reset` through the CLI, against real Redis (single node
and Cluster). The state is written by the runtime's own state layer (ShardStore commits), so
the tools read the layout the runtime writes."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.cli import main
from millstream.connectors.plan import shard_of
from millstream.connectors.segments import Segment, SegmentLayout
from millstream.records import TimeDomain
from millstream.state.client import connect
from millstream.state.keys import ShardKeys, app_key
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.shard_count import record_shard_count, shard_counts_key
from millstream.state.watermarks import Watermark, WatermarkAuthority

SHARDS = 4
T0 = 1_700_000_000_000
STALE = T0  # an updated_at long past: the application is not running


@pytest.fixture(params=["single", "cluster"])
def redis_at(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    url = (
        request.getfixturevalue("redis_url")
        if request.param == "single"
        else request.getfixturevalue("redis_cluster").url
    )
    client = connect(url, cached=False)
    yield url, client
    client.close()


@pytest.fixture
def env(
    redis_at: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Path]:
    url, client = redis_at
    for name in ("MILLSTREAM_APP", "MILLSTREAM_EMBEDDED", "KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("MILLSTREAM_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    return client, tmp_path / "checkpoints"


def _commit(client: Any, app: str, computation: str, key: str, state: bytes, **timers: Any) -> None:
    """One committed shard transaction for `key`, as the runtime writes it."""
    record_shard_count(client, app, computation, SHARDS)
    keys = ShardKeys(app, computation, shard_of(key, SHARDS))
    store = ShardStore(client, keys, ShardConfig(bucket_ms=60_000), SoftStateCache())
    store.acquire()
    txn = store.begin()
    txn.set_state(key, state)
    for tag, (time_ms, domain, hold) in timers.items():
        txn.set_timer(key, tag, time_ms, domain, hold)
    store.commit(txn)


def _app(client: Any, app: str, checkpoints: Path) -> None:
    """Two computations in one query, one in a query of its own, metrics and watermarks."""
    for name in ("counter", "summer", "late"):
        _commit(client, app, name, "k1", json.dumps({"n": 1}).encode())
        client.hset(app_key(app, "metrics", name), mapping={"records": 1, "updated_at": STALE})
        WatermarkAuthority(client, app).publish(name, Watermark(T0, T0))
    client.hset(app_key(app, "consumed", "late", "events"), "0", "5")
    layout = SegmentLayout(client, app)
    layout.save(Segment("main", ("counter", "summer"), ("events",)))
    layout.save(Segment("late", ("late",), ("events",)))
    client.hset(app_key(app, "fused"), "updated_at", STALE)
    client.hset(app_key(app, "fused-late"), "updated_at", STALE)
    for folder in ("fused", "fused-late"):
        (checkpoints / app / folder / "offsets").mkdir(parents=True)


def _keys(client: Any, pattern: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=pattern, count=1000)}


def test_state_prints_the_decoded_state_its_timers_and_holds(
    env: tuple[Any, Path], redis_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = env
    app = redis_namespace
    _commit(
        client,
        app,
        "windower",
        "user*1",  # a glob character: its timers are matched literally
        json.dumps({"count": 3}).encode(),
        w1=(T0 + 1000, TimeDomain.EVENT, T0),
        w2=(T0 + 2000, TimeDomain.EVENT, None),
        poll=(T0 + 500, TimeDomain.WALL, None),
    )
    _commit(client, app, "windower", "user11", b'{"count": 9}', w1=(T0, TimeDomain.EVENT, None))
    assert main(["state", app, "windower", "user*1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["state"] == {"count": 3}
    assert found["shard"] == shard_of("user*1", SHARDS) and found["shards"] == SHARDS
    assert found["timers"] == [
        {"domain": "wall", "tag": "poll", "time": T0 + 500, "hold": None},
        {"domain": "event", "tag": "w1", "time": T0 + 1000, "hold": T0},
        {"domain": "event", "tag": "w2", "time": T0 + 2000, "hold": None},
    ]
    assert main(["state", app, "windower", "user*1"]) == 0
    text = capsys.readouterr().out
    assert '"count": 3' in text and f"holds the watermark at {T0}" in text
    assert main(["state", app, "windower", "nobody"]) == 0
    assert "state: none" in capsys.readouterr().out
    assert main(["state", app, "nothing", "k"]) == 2
    assert "no computation 'nothing'" in capsys.readouterr().err


def test_state_never_unpickles_unless_asked(
    env: tuple[Any, Path], redis_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = env
    app = redis_namespace
    raw = pickle.dumps({"seen": {1, 2}})
    _commit(client, app, "pickler", "k", raw)
    assert main(["state", app, "pickler", "k", "--serde", "pickle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == repr(raw)
    assert main(["state", app, "pickler", "k", "--serde", "pickle", "--unpickle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == repr({"seen": {1, 2}})
    assert main(["state", app, "pickler", "k", "--serde", "bytes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == repr(raw)
    assert main(["state", app, "pickler", "k", "--unpickle"]) == 2  # json serde: refused


def test_reset_removes_everything_of_the_app_and_nothing_else(
    env: tuple[Any, Path],
    redis_namespace: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, checkpoints = env
    app, neighbour = redis_namespace, f"{redis_namespace}.b"  # a name that starts the same
    _app(client, app, checkpoints)
    _app(client, neighbour, checkpoints)
    before_neighbour = _keys(client, f"ms:{{{neighbour}*")

    monkeypatch.setattr("builtins.input", lambda _prompt: "n")
    assert main(["reset", app]) == 1
    assert "nothing removed" in capsys.readouterr().out
    assert _keys(client, f"ms:{{{app}*")

    monkeypatch.setattr("builtins.input", lambda _prompt: "y")
    assert main(["reset", app]) == 0
    assert _keys(client, f"ms:{{{app}}}*") == set() and _keys(client, f"ms:{{{app}:*") == set()
    assert not (checkpoints / app).exists()
    assert _keys(client, f"ms:{{{neighbour}*") == before_neighbour
    assert (checkpoints / neighbour / "fused").exists()


def test_reset_of_one_computation(
    env: tuple[Any, Path], redis_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client, checkpoints = env
    app = redis_namespace
    _app(client, app, checkpoints)
    # In a query of its own: its state, counters, positions and checkpoint all go.
    assert main(["reset", app, "--computation", "late", "--yes"]) == 0
    assert _keys(client, f"ms:{{{app}:late:*") == set()
    assert client.exists(app_key(app, "metrics", "late"), app_key(app, "fused-late")) == 0
    assert client.exists(app_key(app, "consumed", "late", "events")) == 0
    assert client.hget(shard_counts_key(app), "late") is None
    assert client.hget(app_key(app, "wm"), "late") is None
    assert set(SegmentLayout(client, app).load()) == {"main"}
    assert not (checkpoints / app / "fused-late").exists()
    # Sharing the main query: state and counters go, the query's positions stay.
    assert main(["reset", app, "--computation", "summer", "--yes"]) == 0
    assert "shares query 'main'" in capsys.readouterr().out
    assert _keys(client, f"ms:{{{app}:summer:*") == set()
    assert (checkpoints / app / "fused").exists()
    assert _keys(client, f"ms:{{{app}:counter:*")  # untouched
    assert client.hget(app_key(app, "metrics", "counter"), "records") == b"1"
    assert client.hget(shard_counts_key(app), "counter") == str(SHARDS).encode()


def test_reset_refuses_while_the_app_runs(
    env: tuple[Any, Path], redis_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client, checkpoints = env
    app = redis_namespace
    _app(client, app, checkpoints)
    client.hset(app_key(app, "fused"), "updated_at", int(time.time() * 1000) - 1500)
    assert main(["reset", app, "--yes"]) == 2
    err = capsys.readouterr().err
    assert f"app {app!r} is running" in err and "ago" in err
    assert _keys(client, f"ms:{{{app}:counter:*")
    assert (checkpoints / app / "fused").exists()
