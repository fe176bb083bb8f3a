"""A join's throttle as its primary stream's injectors see it (`connectors/throttle.py`).

While a joiner shard holds more than `max_waiting` waiting clicks, the driver sets a flag per
primary stream (`state/throttle.py`); each injector of that stream reads it when it plans a
batch and then admits nothing new. Kafka and log-file injectors share this reader so both
pause alike. The client is made on first use in the planner's process and never shipped.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from millstream.state.client import connect
from millstream.state.throttle import paused

log = logging.getLogger(__name__)


class ThrottleFlag:
    """Whether `stream` of `app` is paused; built only for a source the runtime marked
    `throttle=true`."""

    def __init__(self, redis_url: str, app: str, stream: str) -> None:
        self.redis_url, self.app, self.stream = redis_url, app, stream
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a copy shipped to a task opens its own

    def paused(self) -> bool:
        """One HEXISTS. Unreadable flag: not paused (the bound is a memory guard; stopping the
        input on a Redis blip would stop the pipeline, which the batch's own Redis work will
        report anyway)."""
        try:
            if self._client is None:
                self._client = connect(self.redis_url)
            return paused(self._client, self.app, self.stream)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("injector %s: throttle flag unreadable (%s)", self.stream, exc)
            return False
