"""Planner side of the Kafka injector: notice when the broker is unreachable, even between probes.

The planner probes only when Spark asks for the next batch, and a batch can run for the whole
of a short broker outage (its deliveries fail and retry meanwhile), so probes alone miss
outages. A daemon thread asks the broker for the input topic's metadata once a second and
tells the planner's `OutageHold` when the broker stopped and started answering.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors.watermark import OutageHold
from millstream.state.watermarks import now_ms

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0


class BrokerWatch:
    """Heartbeats to the broker; a failed one marks an outage from the last one answered."""

    def __init__(
        self,
        hold: OutageHold,
        ping: Callable[[], None],
        *,
        interval_s: float = HEARTBEAT_S,
        name: str = "kafka",
    ) -> None:
        self._hold = hold
        self._ping = ping
        self._interval = interval_s
        self._stop = threading.Event()
        self._last_ok: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"millstream-watch-{name}")
        self._thread.daemon = True

    def start(self) -> BrokerWatch:
        self._thread.start()
        return self

    def beat(self) -> None:
        """One heartbeat (the thread's loop body; tests call it directly)."""
        began = now_ms()
        try:
            self._ping()
        except Exception as exc:  # any failure to answer counts
            if self._last_ok is not None:
                log.debug("broker heartbeat failed: %s", exc)
                self._hold.observe(self._last_ok, now_ms(), failed=True)
            return
        self._last_ok = now_ms()
        self._hold.observe(began, self._last_ok)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()

    def close(self) -> None:
        self._stop.set()


def metadata_ping(options: KafkaInjectorOptions, timeout_s: float = 2.0) -> Callable[[], None]:
    """A heartbeat that asks for the first input topic's metadata; raises if unanswered."""
    admin = AdminClient(
        {
            **options.kafka,
            "bootstrap.servers": options.bootstrap_servers,
            "client.id": f"millstream-injector-watch-{options.stream}",
        }
    )
    topic = options.topics[0]

    def ping() -> None:
        try:
            admin.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            raise ConnectionError(str(exc)) from None

    return ping
