"""What a broker answered to transactional requests, read off the wire by a TcpProxy tap.

Fault tests blame a lost production on the broker only with evidence the product's own
records cannot provide. When a broker acknowledges a transaction's commit and later writes an
ABORT marker for its records, only the broker's answers show it: this module records, per
connection, every AddPartitionsToTxn (a transaction starts writing to a partition) and EndTxn
(commit or abort) request with the error code the broker answered, every InitProducerId of a
transactional id with the producer id and epoch it answered, every TxnOffsetCommit (the offsets
a transaction commits, with the answer), and every committed offset
the group coordinator answered to an OffsetFetch (v8 and later, which name the group in the
answer): a transactional sink's progress offsets, read back by the sink itself right after a
resumed commit, are the broker's word on which transaction's offsets it applied. Other requests
are skipped by their length prefix, unparsed.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from millstream.testing.proxy import Observer

OFFSET_FETCH = 9
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
END_TXN = 26
TXN_OFFSET_COMMIT = 28
# First version with compact encodings; OffsetFetch is read from v8 on (groups in the answer).
_FLEXIBLE_FROM = {
    INIT_PRODUCER_ID: 2,
    ADD_PARTITIONS_TO_TXN: 3,
    END_TXN: 3,
    TXN_OFFSET_COMMIT: 3,
    OFFSET_FETCH: 6,
}
_OFFSET_FETCH_FROM = 8
# A request waiting for its answer: api, version, index into the calls, sent at, client id.
_Pending = tuple[int, int, int, float, str]


@dataclass(frozen=True, slots=True)
class TxnCall:
    """One transactional request and the broker's answer (None: no answer seen)."""

    api: str  # "init_producer", "add_partitions", "txn_offsets" or "end_txn"
    transactional_id: str
    producer_id: int  # init_producer: as answered (-1 until then)
    producer_epoch: int  # init_producer: as answered, the new epoch (-1 until then)
    sent_at: float  # time.time() when the proxy forwarded the request
    committed: bool | None = None  # end_txn: commit (True) or abort (False)
    partitions: tuple[tuple[str, int], ...] = ()  # add_partitions, txn_offsets: (topic, partition)
    error_code: int | None = None  # end_txn, init_producer: the answer; add_partitions,
    # txn_offsets: the first non-zero one
    answered_at: float | None = None
    group: str = ""  # txn_offsets: the consumer group whose offsets the transaction commits
    offsets: tuple[tuple[str, int, int], ...] = ()  # txn_offsets: (topic, partition, offset)


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """One committed offset the group coordinator answered to an OffsetFetch."""

    group: str
    topic: str
    partition: int
    offset: int
    answered_at: float  # time.time() when the proxy saw the answer
    asked_at: float = 0.0  # time.time() when the proxy forwarded the request
    client_id: str = ""  # the asking client's client.id


class _Reader:
    """Cursor over one Kafka message body, both plain and compact (flexible) encodings."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self, compact: bool) -> str:
        size = self.uvarint() - 1 if compact else self.take(">h")
        if size < 0:
            return ""
        text = self.data[self.pos : self.pos + size].decode("utf-8", "replace")
        self.pos += size
        return text

    def array_len(self, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.take(">i")

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


class TxnWireLog:
    """Every transactional call seen by a proxy, in the order the proxy forwarded them.

    `tap()` is the TcpProxy tap factory: one (to_broker, to_client) pair of byte observers per
    connection, which reassemble the length-prefixed messages of each direction.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[TxnCall] = []
        self._offsets: list[OffsetAnswer] = []
        self.errors: list[str] = []  # messages that could not be parsed (evidence then refused)

    def calls(self) -> list[TxnCall]:
        with self._lock:
            return list(self._calls)

    def offset_answers(self) -> list[OffsetAnswer]:
        """Every committed offset answered without error, in the order the answers came."""
        with self._lock:
            return list(self._offsets)

    def tap(self) -> tuple[Observer, Observer]:
        pending: dict[int, _Pending] = {}  # by correlation id
        return (
            _Framer(lambda m: self._request(m, pending)).feed,
            _Framer(lambda m: self._response(m, pending)).feed,
        )

    def _request(self, message: bytes, pending: dict[int, _Pending]) -> None:
        api, version, correlation = struct.unpack_from(">hhi", message)
        if api not in _FLEXIBLE_FROM:
            return
        now = time.time()
        if api == OFFSET_FETCH:
            if version >= _OFFSET_FETCH_FROM:  # older answers do not name their group: skipped
                client = _Reader(message, 8).string(compact=False)
                with self._lock:
                    pending[correlation] = (api, version, -1, now, client)
            return
        try:
            flexible = version >= _FLEXIBLE_FROM[api]
            body = _Reader(message, 8)
            body.string(compact=False)  # client id: never compact, even in header v2
            if flexible:
                body.skip_tags()
            txn_id = body.string(flexible)
            if api == INIT_PRODUCER_ID:
                if not txn_id:
                    return  # an idempotent producer's id: no transaction to follow
                call = TxnCall("init_producer", txn_id, -1, -1, now)
                with self._lock:
                    self._calls.append(call)
                    pending[correlation] = (api, version, len(self._calls) - 1, now, "")
                return
            group = body.string(flexible) if api == TXN_OFFSET_COMMIT else ""
            producer_id, epoch = body.take(">q"), body.take(">h")
            if api == TXN_OFFSET_COMMIT:
                call = _txn_offsets(body, version, flexible, txn_id, group, producer_id, epoch, now)
            elif api == END_TXN:
                call = TxnCall("end_txn", txn_id, producer_id, epoch, now, bool(body.take(">b")))
            else:
                parts: list[tuple[str, int]] = []
                for _ in range(body.array_len(flexible)):
                    topic = body.string(flexible)
                    for _ in range(body.array_len(flexible)):
                        parts.append((topic, body.take(">i")))
                    if flexible:
                        body.skip_tags()
                call = TxnCall(
                    "add_partitions", txn_id, producer_id, epoch, now, None, tuple(parts)
                )
        except (struct.error, IndexError) as exc:
            with self._lock:
                self.errors.append(f"request api {api} v{version}: {exc}")
            return
        with self._lock:
            self._calls.append(call)
            pending[correlation] = (api, version, len(self._calls) - 1, now, "")

    def _response(self, message: bytes, pending: dict[int, _Pending]) -> None:
        (correlation,) = struct.unpack_from(">i", message)
        with self._lock:
            known = pending.pop(correlation, None)
        if known is None:
            return
        api, version, index, asked_at, client = known
        if api == OFFSET_FETCH:
            self._offset_fetch_response(message, version, asked_at, client)
            return
        try:
            flexible = version >= _FLEXIBLE_FROM[api]
            body = _Reader(message, 4)
            if flexible:
                body.skip_tags()
            body.take(">i")  # throttle time
            if api == INIT_PRODUCER_ID:
                error = body.take(">h")
                producer_id, epoch = body.take(">q"), body.take(">h")
                with self._lock:
                    self._calls[index] = replace(
                        self._calls[index],
                        producer_id=producer_id,
                        producer_epoch=epoch,
                        error_code=error,
                        answered_at=time.time(),
                    )
                return
            if api == END_TXN:
                error = body.take(">h")
            else:
                error = 0
                for _ in range(body.array_len(flexible)):
                    body.string(flexible)
                    for _ in range(body.array_len(flexible)):
                        body.take(">i")
                        error = error or body.take(">h")
                        if flexible:
                            body.skip_tags()
                    if flexible:
                        body.skip_tags()
        except (struct.error, IndexError) as exc:
            with self._lock:
                self.errors.append(f"response api {api} v{version}: {exc}")
            return
        with self._lock:
            self._calls[index] = replace(
                self._calls[index], error_code=error, answered_at=time.time()
            )

    def _offset_fetch_response(
        self, message: bytes, version: int, asked_at: float, client: str
    ) -> None:
        """Groups -> topics -> partitions of an OffsetFetch v8+ answer (always flexible)."""
        answers: list[OffsetAnswer] = []
        try:
            body = _Reader(message, 4)
            body.skip_tags()
            body.take(">i")  # throttle time
            now = time.time()
            for _ in range(body.array_len(True)):
                group = body.string(True)
                for _ in range(body.array_len(True)):
                    topic = body.string(True)
                    for _ in range(body.array_len(True)):
                        partition, offset = body.take(">i"), body.take(">q")
                        body.take(">i")  # committed leader epoch
                        body.string(True)  # metadata
                        error = body.take(">h")
                        body.skip_tags()
                        if error == 0:
                            answers.append(
                                OffsetAnswer(group, topic, partition, offset, now, asked_at, client)
                            )
                    body.skip_tags()
                group_error = body.take(">h")
                body.skip_tags()
                if group_error != 0:
                    answers = [a for a in answers if a.group != group]
        except (struct.error, IndexError) as exc:
            with self._lock:
                self.errors.append(f"response api {OFFSET_FETCH} v{version}: {exc}")
            return
        with self._lock:
            self._offsets.extend(answers)


def _txn_offsets(
    body: _Reader,
    version: int,
    flexible: bool,
    txn_id: str,
    group: str,
    producer_id: int,
    epoch: int,
    now: float,
) -> TxnCall:
    """The rest of a TxnOffsetCommit request: the offsets a transaction commits for `group`."""
    if version >= 3:  # KIP-447: the consumer's generation, member and instance ids
        body.take(">i")
        body.string(flexible)
        body.string(flexible)
    offsets: list[tuple[str, int, int]] = []
    for _ in range(body.array_len(flexible)):
        topic = body.string(flexible)
        for _ in range(body.array_len(flexible)):
            partition, offset = body.take(">i"), body.take(">q")
            if version >= 2:
                body.take(">i")  # committed leader epoch
            body.string(flexible)  # metadata
            if flexible:
                body.skip_tags()
            offsets.append((topic, partition, offset))
        if flexible:
            body.skip_tags()
    return TxnCall(
        "txn_offsets", txn_id, producer_id, epoch, now, None,
        tuple((t, p) for t, p, _ in offsets), group=group, offsets=tuple(offsets),
    )  # fmt: skip


class _Framer:
    """Reassembles a byte stream into Kafka messages (int32 size, then that many bytes)."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        self._on_message = on_message
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 4:
            (size,) = struct.unpack_from(">i", self._buffer)
            if len(self._buffer) < 4 + size:
                return
            message = bytes(self._buffer[4 : 4 + size])
            del self._buffer[: 4 + size]
            self._on_message(message)
