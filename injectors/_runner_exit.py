"""A stream reader's process ends quietly when its query stops.

Spark runs each Python stream reader in a process of its own
(`pyspark.sql.streaming.python_streaming_source_runner`) that waits on a socket for the JVM's
next call. A query that stops (Ctrl-C, SIGTERM, a restart at run time) or a JVM that ends just
closes that socket: the runner's read raises EOFError, it tries to send the error back over the
closed socket and prints two tracebacks to the pipeline's log, after a clean stop. There is no
one left to report to, so the reader's `stop()`, which the runner calls on its way out, ends
the process itself with nothing printed. Any other error still takes Spark's path (it reaches
the JVM, and the query fails with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def in_stream_runner() -> bool:
    """Whether this process is Spark's stream reader runner (`python -m` of that module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == RUNNER


def exit_if_query_stopped() -> None:
    """End this process at once if it is a stream reader runner whose socket the JVM closed.

    Called from a reader's `stop()`: the runner calls it in a `finally` while the EOFError of
    its closed socket propagates, which `sys.exc_info()` shows there.
    """
    if isinstance(sys.exc_info()[1], EOFError) and in_stream_runner():
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to keep
                stream.flush()
        os._exit(0)
