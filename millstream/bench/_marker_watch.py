"""A live, incremental version of `millstream.testing.committed_reader`: notes the moment each
record becomes visible to an Apache Kafka `read_committed` consumer.

Tansu's own `read_committed` view can stall (its last stable offset stops advancing while
transactional producers of one `transactional.id` fence each other, as Spark Python workers
sharing a shard's producer id do), which would turn a broker defect into latency. This watcher
fetches raw record batches (control batches included) from where it left off, per partition,
and applies the markers itself: a non-transactional record is visible when fetched, a
transactional one when the COMMIT marker of its producer is fetched; aborted ones never.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kafka.protocol.consumer import FetchRequest
from kafka.record import MemoryRecords

from millstream.testing.committed_reader import _Connection, _leaders

_COMMIT = 1


def _fetch(conn: _Connection, version: int, topic: str, partition: int, position: int) -> Any:
    request = FetchRequest[version](
        replica_id=-1,
        max_wait_ms=10,
        min_bytes=0,
        max_bytes=8 << 20,
        isolation_level=0,  # raw log: aborted data and control batches included
        topics=[
            FetchRequest.FetchTopic(
                topic=topic,
                partitions=[
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=partition, fetch_offset=position, partition_max_bytes=8 << 20
                    )
                ],
            )
        ],
    )
    responses = conn.request(request).responses
    if not responses or not responses[0].partitions:
        return None
    return responses[0].partitions[0]


class MarkerAwareWatcher(threading.Thread):
    """Calls `on_record(seen_ms, key, value)` once per record, when it becomes visible."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        on_record: Callable[[int, bytes | None, bytes], None],
        poll_s: float = 0.05,
    ) -> None:
        super().__init__(name=f"markers-{topic}", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.on_record = on_record
        self.poll_s = poll_s
        self.count = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        """Stop polling; raises what made the watcher fail, if anything did."""
        self._halt.set()
        self.join(10)
        if self.error is not None:
            raise RuntimeError(f"watching {self.topic} failed: {self.error!r}") from self.error

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as exc:
            self.error = exc

    def _emit(self, seen: int, records: list[tuple[bytes | None, bytes]]) -> None:
        for key, value in records:
            self.count += 1
            self.on_record(seen, key, value)

    def _watch(self) -> None:
        leaders = _leaders(self.bootstrap, self.topic, 30.0)
        conns = {p: _Connection(host, port, 30.0) for p, (host, port) in leaders.items()}
        versions = {p: c.version(FetchRequest, "Fetch") for p, c in conns.items()}
        positions = dict.fromkeys(conns, 0)
        pending: dict[tuple[int, int], list[tuple[bytes | None, bytes]]] = {}
        try:
            while not self._halt.is_set():
                for partition, conn in conns.items():
                    part = _fetch(
                        conn, versions[partition], self.topic, partition, positions[partition]
                    )
                    if part is None or part.error_code:
                        continue
                    seen = time.time_ns() // 1_000_000
                    records = MemoryRecords(bytes(part.records or b""))
                    while records.has_next():
                        batch = records.next_batch()
                        if batch is None:
                            break
                        next_offset = batch.base_offset + batch.last_offset_delta + 1
                        if next_offset <= positions[partition]:
                            continue
                        rows = [r for r in batch if r.offset >= positions[partition]]
                        positions[partition] = next_offset
                        slot = (partition, batch.producer_id)
                        if batch.is_control_batch:
                            done = pending.pop(slot, [])
                            if any(getattr(r, "type", None) == _COMMIT for r in rows):
                                self._emit(seen, done)
                        elif batch.is_transactional:
                            pending.setdefault(slot, []).extend((r.key, r.value) for r in rows)
                        else:
                            self._emit(seen, [(r.key, r.value) for r in rows])
                self._halt.wait(self.poll_s)
        finally:
            for conn in conns.values():
                conn.close()
