"""The application's holder (`state/holder.py`) on a single Redis and a Redis Cluster.

One copy holds an application; another sees who, and since when; a heartbeat keeps it; a
lapsed heartbeat, a release or a dead process on this host lets the other take over.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from millstream.state import holder
from millstream.state.holder import Holder


def _app() -> str:
    return f"mstest-{uuid.uuid4().hex[:12]}"


def test_one_copy_holds_the_other_sees_who_and_takes_over_after_a_release(
    store_client: Any,
) -> None:
    app = _app()
    first, second = (
        Holder.this_process(),
        dataclasses.replace(Holder.this_process(), token="other", pid=1),
    )
    assert holder.claim(store_client, app, first) is None
    since = holder.current(store_client, app).since  # type: ignore[union-attr]
    time.sleep(0.01)
    assert holder.claim(store_client, app, first) is None  # a heartbeat keeps `since`
    seen = holder.claim(store_client, app, second)
    assert seen is not None and (seen.token, seen.pid, seen.since) == (
        first.token,
        first.pid,
        since,
    )
    assert seen.beat >= since and "holding it since" in seen.describe()
    holder.release(store_client, app, second)  # not its to release
    assert holder.current(store_client, app).token == first.token  # type: ignore[union-attr]
    holder.release(store_client, app, first)
    assert holder.claim(store_client, app, second) is None


def test_a_lapsed_heartbeat_lets_another_copy_in(store_client: Any) -> None:
    app = _app()
    paused = dataclasses.replace(Holder.this_process(), host="elsewhere")
    assert holder.claim(store_client, app, paused, ttl_ms=300) is None
    other = Holder.this_process()
    seen = holder.claim(store_client, app, other)
    assert seen is not None and not seen.gone_here()  # another host: only its heartbeat tells
    time.sleep(0.4)
    assert holder.claim(store_client, app, other) is None
    assert holder.claim(store_client, app, paused) is not None  # it wakes: not its any more


def test_a_dead_process_on_this_host_is_replaced_at_once(store_client: Any) -> None:
    app = _app()
    me = Holder.this_process()
    assert not me.gone_here()
    dead = dataclasses.replace(me, token="dead", pid=me.pid, started="1")  # pid reused since
    assert dead.gone_here()
    assert holder.claim(store_client, app, dead) is None
    assert holder.claim(store_client, app, me) is not None
    assert holder.replace_dead(store_client, app, dead)
    assert not holder.replace_dead(store_client, app, dead)  # only while it still holds it
    assert holder.claim(store_client, app, me) is None
