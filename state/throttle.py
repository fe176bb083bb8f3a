"""The throttle flags: which streams a join's throttle pauses (`connectors/throttle.py`).

One hash per application, `ms:{app}:throttle`, field = a paused stream, value = why (JSON).
The driver writes it before a batch; the stream's injectors read it when they plan the next.
"""

from __future__ import annotations

from millstream.state.client import RedisClient
from millstream.state.keys import app_key


def throttle_key(app: str) -> str:
    return app_key(app, "throttle")


def paused(client: RedisClient, app: str, stream: str) -> bool:
    """Injector side: whether `stream` takes no new input in the next batch (one HEXISTS)."""
    return bool(client.hexists(throttle_key(app), stream))
