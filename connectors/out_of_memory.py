"""Redis at maxmemory: a batch whose commit Redis refused is run again until Redis accepts
writes (a refused commit writes nothing, and the re-run is a replay: shards that did commit
see their records as replays), for at most `OOM_RETRY_SECONDS`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from millstream.errors import MillstreamError
from millstream.settings import mask_url

log = logging.getLogger(__name__)
OOM_RETRY_SECONDS = 600  # how long a batch waits for Redis to accept writes again


def redis_out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write at maxmemory: raised here, or in a Spark task (then only the
    text of the worker's traceback reaches the driver)."""
    text = str(exc)  # Redis says "OOM command not allowed when used memory > 'maxmemory'"
    return isinstance(exc, redis.OutOfMemoryError) or "command not allowed when used memory" in text


def run_while_redis_full(
    run: Callable[[], None], app: str, redis_url: str, batch_id: int, active: Callable[[], bool]
) -> None:
    """`run` the batch; while Redis refuses its writes at maxmemory, say so and run it again,
    backing off to 10 s, while the query is `active`. Any other failure is raised."""
    deadline = time.monotonic() + OOM_RETRY_SECONDS
    delay = 1.0
    while True:
        try:
            run()
            return
        except Exception as exc:
            if not redis_out_of_memory(exc) or not active():
                raise
            message = (
                f"Redis at {mask_url(redis_url)} is at maxmemory and refuses writes (OOM command "
                f"not allowed): application {app!r} cannot commit batch {batch_id}. Fix: raise "
                "Redis maxmemory (CONFIG SET maxmemory <bytes>, 0 for no limit) or free memory, "
                "and keep maxmemory-policy noeviction (evicting would lose state)."
            )
            if time.monotonic() + delay > deadline:
                raise MillstreamError(
                    f"{message} Gave up after {OOM_RETRY_SECONDS} s; restart when fixed."
                ) from None
            log.error("%s Retrying in %.0f s.", message, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
