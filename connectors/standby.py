"""`millstream run` holds its application while it runs, or waits as a standby for it.

`state/holder.py` keeps the record; this is the running side: a claim at start (waiting while
another copy holds the application, saying who), a heartbeat thread while it runs, and a
release on a clean stop so a standby takes over at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from millstream.state import holder as holders
from millstream.state.client import connect
from millstream.state.holder import Holder
from millstream.state.watermarks import now_ms

log = logging.getLogger(__name__)
LOOK_S = 0.5  # how often a standby looks at the holder


class Heartbeat:
    """This process's hold on an application."""

    def __init__(
        self,
        redis_url: str,
        app: str,
        stop: threading.Event,
        beat_s: float = holders.BEAT_S,
        ttl_ms: int = holders.TTL_MS,
    ) -> None:
        self.client = connect(redis_url, cached=False)
        self.app = app
        self.stop = stop
        self.beat_s = beat_s
        self.ttl_ms = ttl_ms
        self.me = Holder.this_process()
        self.lost: Holder | None = None  # another copy took the application over
        self._thread: threading.Thread | None = None
        self.warming: threading.Thread | None = None
        self._done = threading.Event()

    def _claim(self) -> Holder | None:
        return holders.claim(self.client, self.app, self.me, self.ttl_ms)

    def wait_for_turn(self, while_waiting: Callable[[], None] | None = None) -> bool:
        """Hold the application, waiting as a standby while another copy does; False if told
        to stop first. `while_waiting` runs in a thread (`warming`) if it has to wait: Spark
        starts meanwhile, and the takeover is quick."""
        other = self._retrying(self._claim)
        if other is None:
            return True
        log.warning(
            "application %s is already running: %s. This copy waits as a standby and takes "
            "over when that one stops, dies, or misses its heartbeat for %.0f s",
            self.app, other.describe(), self.ttl_ms / 1000,
        )  # fmt: skip
        if while_waiting is not None:
            self.warming = threading.Thread(
                target=while_waiting, name="millstream-standby-warm", daemon=True
            )
            self.warming.start()
        while not self.stop.is_set():
            if other.gone_here() and holders.replace_dead(self.client, self.app, other):
                log.warning(
                    "the copy holding application %s (process %d on this host) is gone",
                    self.app, other.pid,
                )  # fmt: skip
            seen = self._retrying(self._claim)
            if seen is None:
                log.warning(
                    "this copy took over application %s from host %s process %d",
                    self.app, other.host, other.pid,
                )  # fmt: skip
                return True
            if seen.token != other.token:
                log.warning("application %s is now held by %s", self.app, seen.describe())
            other = seen
            self.stop.wait(LOOK_S)
        return False

    def _retrying(self, call: Callable[[], Holder | None]) -> Holder | None:
        """`call`, again every second while Redis does not answer (or until told to stop)."""
        while True:
            try:
                return call()
            except redis.RedisError as exc:
                if self.stop.is_set():
                    raise
                log.warning("Redis did not answer while claiming application %s: %s", self.app, exc)
                self.stop.wait(1.0)

    def start(self) -> None:
        """Renew the hold every `beat_s` in a thread, until `close`."""
        self._thread = threading.Thread(target=self._beat, name="millstream-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        failing = False
        while not self._done.wait(self.beat_s):
            try:
                other = self._claim()
            except redis.RedisError as exc:
                if not failing:
                    log.warning("heartbeat of application %s not written: %s", self.app, exc)
                failing = True
                continue
            failing = False
            if other is not None:
                self.lost = other
                log.error(
                    "another copy took over application %s (%s): this copy stops; started "
                    "again, it waits as a standby",
                    self.app, other.describe(now_ms()),
                )  # fmt: skip
                self.stop.set()
                return

    def close(self) -> None:
        """Stop the heartbeat; release the application unless another copy took it."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.lost is None:
            try:
                holders.release(self.client, self.app, self.me)
            except redis.RedisError as exc:  # it expires on its own
                log.warning("could not release application %s: %s", self.app, exc)
        self.client.close()
