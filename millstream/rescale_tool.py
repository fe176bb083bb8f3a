"""`millstream rescale APP COMPUTATION --shards N`: ask for a new shard count, and follow it.

The move itself is the application's driver's, between two batches (`connectors/rescaling.py`,
`state/rescale.py`): it alone knows no shard task of its query runs, and which computations are
joins (refused). So this command records the request; if the application runs, it waits until
the recorded layout changes and prints what moved; if not, the next `millstream run` applies it
before its first batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from millstream.state import holder as holders
from millstream.state.rescale import last_report
from millstream.state.shard_count import (
    pending_rescales,
    read_layout,
    request_rescale,
    rescale_requests_key,
)
from millstream.state.watermarks import now_ms
from millstream.state_tools import layout_of

PROGRESS_S = 5.0


def rescale(
    client: Any,
    app: str,
    computation: str,
    shards: int,
    timeout_s: float,
    wait: bool,
    say: Callable[[str], None] = print,
) -> int:
    """Exit status: 0 applied (or recorded for the next start), 1 refused or not applied yet."""
    before = layout_of(client, app, computation)  # refuses an unknown computation
    if before.shards == shards:
        waiting = pending_rescales(client, app).get(computation)
        if waiting is not None:  # back to the count it has: the request not applied yet goes
            client.hdel(rescale_requests_key(app), computation)
            say(f"{computation} of {app} stays at {shards} shards: the request for {waiting} "
                "shards, not applied yet, is withdrawn")  # fmt: skip
            return 0
        say(f"{computation} of {app} already runs with {before.describe()}: nothing to do")
        return 0
    last = last_report(client, app, computation)
    request_rescale(client, app, computation, shards)
    say(f"requested: {computation} of {app} from {before.describe()} to {shards} shards")
    running = holders.current(client, app)
    if running is not None and now_ms() - running.beat > holders.TTL_MS:
        running = None
    if running is None and not wait:
        say(
            f"{app} is not running: its next `millstream run` moves the keys before its first batch"
        )
        return 0
    if running is not None:
        say(f"waiting for the running application ({running.describe()}) to apply it")
    started = time.monotonic()
    shown = started
    while time.monotonic() - started < timeout_s:
        layout = read_layout(client, app, computation)
        report = last_report(client, app, computation)
        if layout is not None and layout != before:
            moved = report or {}
            say(
                f"rescaled {computation} of {app}: {before.describe()} -> {layout.describe()}; "
                f"moved {moved.get('keys', '?')} keys, {moved.get('timers', '?')} timers, "
                f"{moved.get('catalog_entries', '?')} catalog entries in "
                f"{moved.get('seconds', '?')} s"
            )
            return 0
        if report is not None and report != last and "error" in report:
            say(f"refused by the application: {report['error']}")
            return 1
        if time.monotonic() - shown >= PROGRESS_S:
            shown = time.monotonic()
            say(f"still waiting ({shown - started:.0f} s): the move runs between two batches")
        time.sleep(0.2)
    say(
        f"not applied within {timeout_s:.0f} s; the request stays recorded and the application "
        "applies it between two batches, or at its next start (a move waits while old shards "
        "hold productions not yet delivered: see its log)"
    )
    return 1
