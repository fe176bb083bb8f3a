"""The README's least-privilege Redis ACL line is enough for the state layer, and no more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from millstream.embedded import start_redis
from millstream.records import Production, TimeDomain
from millstream.state import event_store, holder, replay
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache, oldest_work
from millstream.state.watermarks import Watermark, WatermarkAuthority
from millstream.status import status
from tests.secrets import secret

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_documented_acl_line_allows_millstream_and_nothing_else(tmp_path: Path) -> None:
    line = re.search(r"^ACL SETUSER millstream .*$", README, flags=re.M)
    assert line, "the README documents an ACL line"
    app = "acl-app"
    password = secret("acl")
    command = line.group(0).replace("<app>", app).replace(">PASSWORD", f">{password}")
    service = start_redis(tmp_path / "redis")
    try:
        admin = redis.Redis.from_url(service.url)
        admin.execute_command(*command.split()[0:2], *command.split()[2:])
        url = service.url.replace("redis://", f"redis://millstream:{password}@")
        client = connect(url, cached=False)

        keys = ShardKeys(app, "comp", 0)
        store = ShardStore(client, keys, ShardConfig(), SoftStateCache())
        store.acquire()
        store.dedup([(b"r1", 1, b"p")], 0)
        store.load(["k"], 0, 0)
        txn = store.begin()
        txn.set_state("k", b"1")
        txn.set_timer("k", "t", 5, TimeDomain.EVENT)
        txn.add_ids([(0, b"r1", b"p")])
        txn.checkpoint(Production("out", "k", b"v", 5, b"pid", 1))
        store.commit(txn)
        authority = WatermarkAuthority(client, app)
        authority.publish("comp", Watermark(5, 5))
        assert oldest_work(client, [keys])[0].event == 5
        assert status(client, app)["app"] == app
        # The application's other keys: its holder, the replay queue, a join's event store.
        assert holder.claim(client, app, holder.Holder.this_process()) is None
        replay.enqueue(client, app, [replay.Replay(b"l", "comp", "s", None, b"v", 1)])
        assert len(replay.read_queue(client, app, ["comp"], 10)) == 1
        event_store.put(client, f"{app}:es:joiner", [("q1", b"query")], 60)
        assert event_store.get(client, f"{app}:es:joiner", ["q1"]) == [b"query"]

        other = ShardKeys("someone-else", "comp", 0)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set(other.sequencer, 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()
        client.close()
    finally:
        service.stop()
