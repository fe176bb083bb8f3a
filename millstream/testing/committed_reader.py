"""What an Apache Kafka `read_committed` consumer would see, computed from raw record batches.

Some brokers (Tansu 0.6) write COMMIT/ABORT control markers correctly but serve aborted
transactional records to `read_committed` consumers anyway. This reader fetches the raw log
(`isolation_level=READ_UNCOMMITTED`, control batches included) with kafka-python's protocol and
record-batch parser and applies the markers itself, as Apache Kafka does:

- non-transactional records count;
- transactional records count only if the next control marker of the same producer id is COMMIT;
- nothing at or after the first offset of a still-open transaction counts (the consumer stops at
  the last stable offset).

So exactly-once output can be verified on such a broker. `probe_aborted_leak()` tells whether
the broker has the defect, so a test can report a plain consumer's view as an expected failure
there and assert it everywhere else.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.record import MemoryRecords

from millstream.errors import MillstreamError, TransientError

_OFFSET_OUT_OF_RANGE = 1
_SHORT_WAIT_MS = 10  # Tansu answers max_wait_ms=0 with an empty response
_LONG_WAIT_MS = 500
_RETRIABLE_FETCH = {3, 5, 6, 7, 9, 14, 15, 56, 74, 75, 76}  # unknown tp, leader moves, timeouts
_CAPS = {"Metadata": 8, "Fetch": 11, "ListOffsets": 5}  # newest non-flexible versions we use


class LogHoleError(MillstreamError):
    """Offsets below a partition's high watermark that the broker never serves: lost data."""


@dataclass(frozen=True, slots=True)
class CommittedRecord:
    """One record a read_committed consumer would receive."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...]
    producer_id: int
    transactional: bool

    def header(self, name: str) -> bytes | None:
        """The first header called `name`, or None."""
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True, slots=True)
class RawBatch:
    """A record batch as stored, data or control, with its records."""

    base_offset: int
    next_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool
    records: tuple[Any, ...]  # kafka-python DefaultRecord / ControlRecord
    base_sequence: int = -1  # the idempotent producer's sequence of the first record


class _Connection:
    """One blocking socket to a broker speaking kafka-python's request/response classes."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.settimeout(timeout)
        self._proto = KafkaProtocol(client_id="millstream-committed-reader")
        self._versions: dict[int, tuple[int, int]] = {}
        response = self.request(ApiVersionsRequest[0]())
        self._versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}

    def version(self, cls: Any, name: str) -> int:
        broker_min, broker_max = self._versions.get(cls.API_KEY, (0, _CAPS[name]))
        ours_min, _ours_max = cls.valid_versions
        chosen = min(_CAPS[name], broker_max)
        if chosen < max(broker_min, ours_min):
            raise MillstreamError(
                f"the broker supports {name} v{broker_min}-{broker_max}; this reader speaks "
                f"v{ours_min}-{_CAPS[name]}: upgrade kafka-python or the broker"
            )
        return chosen

    def request(self, request: Any) -> Any:
        self._proto.send_request(request)
        self._sock.sendall(self._proto.send_bytes())
        while True:
            data = self._sock.recv(1 << 20)
            if not data:
                raise TransientError("the broker closed the connection")
            responses = self._proto.receive_bytes(data)
            if responses:
                return responses[0][1]

    def close(self) -> None:
        self._sock.close()


def _split(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0].strip()
    for prefix in ("PLAINTEXT://", "plaintext://"):
        first = first.removeprefix(prefix)
    host, _, port = first.rpartition(":")
    return host.strip("[]"), int(port)


def _leaders(bootstrap: str, topic: str, timeout: float) -> dict[int, tuple[str, int]]:
    """partition -> (host, port) of its leader."""
    deadline = time.monotonic() + timeout
    while True:
        conn = _Connection(*_split(bootstrap), timeout)
        try:
            version = conn.version(MetadataRequest, "Metadata")
            request = MetadataRequest[version](
                topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                allow_auto_topic_creation=False,
            )
            response = conn.request(request)
        finally:
            conn.close()
        brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        (meta,) = [t for t in response.topics if t.name == topic]
        if meta.error_code == 0 and meta.partitions:
            return {p.partition_index: brokers[p.leader_id] for p in meta.partitions}
        if time.monotonic() > deadline:
            raise MillstreamError(f"topic {topic!r}: metadata error code {meta.error_code}")
        time.sleep(0.1)


def _earliest(conn: _Connection, topic: str, partition: int) -> int:
    return _list_offset(conn, topic, partition, -2, 0)


def last_stable_offset(bootstrap: str, topic: str, partition: int, *, timeout: float = 10.0) -> int:
    """The partition's end offset as the broker tells a read_committed consumer (its last
    stable offset): compared with the raw log's markers, it shows where the broker holds back."""
    host, port = _leaders(bootstrap, topic, timeout)[partition]
    conn = _Connection(host, port, timeout)
    try:
        return _list_offset(conn, topic, partition, -1, 1)
    finally:
        conn.close()


def _list_offset(
    conn: _Connection, topic: str, partition: int, timestamp: int, isolation: int
) -> int:
    version = conn.version(ListOffsetsRequest, "ListOffsets")
    request = ListOffsetsRequest[version](
        replica_id=-1,
        isolation_level=isolation,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[
                    ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=partition, timestamp=timestamp
                    )
                ],
            )
        ],
    )
    part = conn.request(request).topics[0].partitions[0]
    if part.error_code:
        raise MillstreamError(f"{topic}[{partition}]: ListOffsets error code {part.error_code}")
    return int(part.offset)


@dataclass(frozen=True, slots=True)
class LogHole:
    """Offsets [first, next) of a partition below its high watermark that the broker never serves."""

    topic: str
    partition: int
    first: int
    next: int

    @property
    def size(self) -> int:
        return self.next - self.first


def read_raw(
    bootstrap: str,
    topic: str,
    partition: int,
    *,
    timeout: float = 10.0,
    holes: list[LogHole] | None = None,
) -> tuple[list[RawBatch], int]:
    """Every record batch of one partition from the log start, and the high watermark.

    A hole (see LogHoleError) raises, unless `holes` is given: then it is appended there and the
    read goes on past it, so that a test can still check everything the broker does serve.
    """
    host, port = _leaders(bootstrap, topic, timeout)[partition]
    conn = _Connection(host, port, timeout)
    try:
        return _fetch_all(conn, topic, partition, timeout, holes)
    finally:
        conn.close()


def read_raw_topic(
    bootstrap: str, topic: str, *, timeout: float = 10.0, holes: list[LogHole] | None = None
) -> list[list[RawBatch]]:
    """The raw batches of every partition of `topic`, indexed by partition (see `read_raw`)."""
    out: list[list[RawBatch]] = []
    for partition, (host, port) in sorted(_leaders(bootstrap, topic, timeout).items()):
        assert partition == len(out), f"{topic}: partitions are not numbered 0..n-1"
        conn = _Connection(host, port, timeout)
        try:
            out.append(_fetch_all(conn, topic, partition, timeout, holes)[0])
        finally:
            conn.close()
    return out


def _fetch_all(
    conn: _Connection,
    topic: str,
    partition: int,
    timeout: float,
    holes: list[LogHole] | None = None,
) -> tuple[list[RawBatch], int]:
    """Fetch from the log start up to the high watermark (skipping holes into `holes`)."""
    version = conn.version(FetchRequest, "Fetch")
    hole_start: int | None = None  # first offset of the hole being stepped over
    position, max_bytes = 0, 8 << 20
    deadline = time.monotonic() + timeout
    wait_ms = _SHORT_WAIT_MS
    out: list[RawBatch] = []
    while True:
        request = FetchRequest[version](
            replica_id=-1,
            max_wait_ms=wait_ms,
            min_bytes=0 if wait_ms == _SHORT_WAIT_MS else 1,
            max_bytes=max_bytes,
            isolation_level=0,  # raw log, aborted data and control batches included
            topics=[
                FetchRequest.FetchTopic(
                    topic=topic,
                    partitions=[
                        FetchRequest.FetchTopic.FetchPartition(
                            partition=partition,
                            fetch_offset=position,
                            partition_max_bytes=max_bytes,
                        )
                    ],
                )
            ],
        )
        responses = conn.request(request).responses
        if not responses or not responses[0].partitions:
            if time.monotonic() > deadline:
                raise TransientError(f"{topic}[{partition}]: the broker returned no fetch data")
            continue
        part = responses[0].partitions[0]
        if part.error_code == _OFFSET_OUT_OF_RANGE and position == 0:
            position = _earliest(conn, topic, partition)
            continue
        if part.error_code in _RETRIABLE_FETCH and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        if part.error_code:
            raise MillstreamError(f"{topic}[{partition}]: Fetch error code {part.error_code}")
        records = MemoryRecords(bytes(part.records or b""))
        fetched_at, advanced, truncated = position, False, False
        while records.has_next():
            batch = records.next_batch()
            if batch is None:
                truncated = True
                break
            next_offset = batch.base_offset + batch.last_offset_delta + 1
            if next_offset <= position:
                continue
            out.append(
                RawBatch(
                    base_offset=batch.base_offset,
                    next_offset=next_offset,
                    producer_id=batch.producer_id,
                    producer_epoch=batch.producer_epoch,
                    transactional=bool(batch.is_transactional),
                    control=bool(batch.is_control_batch),
                    records=tuple(r for r in batch if r.offset >= position),
                    base_sequence=int(batch.base_sequence),
                )
            )
            position, advanced = next_offset, True
        if advanced and hole_start is not None and holes is not None:
            holes.append(LogHole(topic, partition, hole_start, fetched_at))
            hole_start, deadline = None, time.monotonic() + timeout
        if position >= part.high_watermark:
            if hole_start is not None and holes is not None:
                holes.append(LogHole(topic, partition, hole_start, int(part.high_watermark)))
            return out, int(part.high_watermark)
        if not advanced:
            expired = time.monotonic() > deadline  # read once: the branches below must agree
            if truncated:
                if max_bytes >= 256 << 20 or expired:
                    raise MillstreamError(f"{topic}[{partition}]: no progress at offset {position}")
                max_bytes *= 2  # a batch larger than the fetch size
            elif wait_ms == _SHORT_WAIT_MS:
                # Tansu on s3:// storage answers a short fetch below the high watermark with no
                # records while it loads them (after a restart, for example): wait for data.
                wait_ms = _LONG_WAIT_MS
            elif hole_start is not None:
                position += 1  # inside a known hole: one long fetch per offset, then the next
            elif expired and holes is not None:
                hole_start, position = position, position + 1
            elif expired:
                raise LogHoleError(
                    f"{topic}[{partition}]: the broker serves nothing at offset {position}, below "
                    f"its high watermark {part.high_watermark}: records the log claims to hold "
                    "are gone (seen on Tansu with s3:// storage after a kill -9: the batch being "
                    "written was counted but not stored)"
                )


def apply_markers(topic: str, partition: int, batches: list[RawBatch]) -> list[CommittedRecord]:
    """The read_committed view of one partition's batches (see the module docstring)."""
    visible: list[CommittedRecord] = []
    open_txns: dict[int, list[CommittedRecord]] = {}
    open_first: dict[int, int] = {}
    for batch in batches:
        if batch.control:
            pending = open_txns.pop(batch.producer_id, [])
            open_first.pop(batch.producer_id, None)
            committed = any(getattr(r, "type", None) == 1 for r in batch.records)
            if committed:
                visible.extend(pending)
            continue
        rows = [
            CommittedRecord(
                topic=topic,
                partition=partition,
                offset=r.offset,
                key=r.key,
                value=r.value,
                timestamp=r.timestamp,
                headers=tuple((k, v) for k, v in r.headers),
                producer_id=batch.producer_id,
                transactional=batch.transactional,
            )
            for r in batch.records
        ]
        if batch.transactional:
            open_txns.setdefault(batch.producer_id, []).extend(rows)
            open_first.setdefault(batch.producer_id, batch.base_offset)
        else:
            visible.extend(rows)
    stable = min(open_first.values(), default=None)  # the last stable offset
    rows = sorted(visible, key=lambda r: r.offset)
    return rows if stable is None else [r for r in rows if r.offset < stable]


def aborted_values(batches: list[RawBatch]) -> list[bytes]:
    """Values of the transactional records that an ABORT marker of their producer closed."""
    out: list[bytes] = []
    pending: dict[int, list[bytes]] = {}
    for batch in batches:
        if batch.control:
            values = pending.pop(batch.producer_id, [])
            if not any(getattr(r, "type", None) == 1 for r in batch.records):
                out.extend(values)
        elif batch.transactional:
            pending.setdefault(batch.producer_id, []).extend(
                bytes(r.value or b"") for r in batch.records
            )
    return out


COMMIT_MARKER, ABORT_MARKER = "COMMIT", "ABORT"


@dataclass(frozen=True, slots=True)
class RecordOrigin:
    """Where one data record sits in the raw log, and how its transaction ended.

    `marker` is the next control marker of its producer id after it (COMMIT or ABORT), None for
    a transaction with no marker yet, or "" for a non-transactional record.
    """

    partition: int
    offset: int
    producer_id: int
    producer_epoch: int
    marker: str | None
    value: bytes


def record_origins(partition: int, batches: list[RawBatch]) -> dict[int, RecordOrigin]:
    """offset -> origin of every data record of one partition's raw batches."""
    out: dict[int, RecordOrigin] = {}
    open_rows: dict[int, list[tuple[RawBatch, Any]]] = {}
    for batch in batches:
        if batch.control:
            committed = any(getattr(r, "type", None) == 1 for r in batch.records)
            marker = COMMIT_MARKER if committed else ABORT_MARKER
            for data, r in open_rows.pop(batch.producer_id, []):
                out[r.offset] = _origin(partition, data, r, marker)
        elif batch.transactional:
            open_rows.setdefault(batch.producer_id, []).extend((batch, r) for r in batch.records)
        else:
            out.update({r.offset: _origin(partition, batch, r, "") for r in batch.records})
    for rows in open_rows.values():
        out.update({r.offset: _origin(partition, data, r, None) for data, r in rows})
    return out


def _origin(partition: int, batch: RawBatch, record: Any, marker: str | None) -> RecordOrigin:
    return RecordOrigin(
        partition,
        record.offset,
        batch.producer_id,
        batch.producer_epoch,
        marker,
        bytes(record.value or b""),
    )


def live_epochs(partitions: Sequence[list[RawBatch]]) -> dict[int, int]:
    """Producer id -> the highest epoch any batch of it carries: its live instance.

    Re-initialising a transactional id keeps its producer id and bumps the epoch (Apache Kafka
    and Tansu alike), fencing the older instances; a producer id whose transactional id moved to
    another id keeps its last epoch here, so it counts as live (the cautious reading).
    """
    out: dict[int, int] = {}
    for batches in partitions:
        for batch in batches:
            if batch.transactional and batch.producer_id >= 0:
                out[batch.producer_id] = max(out.get(batch.producer_id, -1), batch.producer_epoch)
    return out


@dataclass(frozen=True)
class PlainView:
    """A plain read_committed consumer's records against the marker-aware view of the raw log.

    `leaked`: served although aborted, each under an ABORT marker of a fenced (non-live)
    producer instance: the broker's known defect. `unexplained`: served although not in the
    read_committed view for any other reason (under COMMIT past an open transaction, under
    ABORT of the live instance, in no raw batch, served twice). `withheld`: (partition, offset)
    of committed records the consumer never received.
    """

    leaked: list[RecordOrigin]
    unexplained: list[str]
    withheld: list[tuple[int, int]]

    @property
    def exact(self) -> bool:
        return not self.leaked and not self.unexplained and not self.withheld

    @property
    def only_leaks(self) -> bool:
        """Every difference is a record the broker served from a fenced aborted transaction."""
        return bool(self.leaked) and not self.unexplained and not self.withheld

    def summary(self) -> str:
        leaked = collections.Counter((o.producer_id, o.producer_epoch) for o in self.leaked)
        return (
            f"{len(self.leaked)} aborted records of fenced producers served "
            f"(producer id/epoch: {dict(leaked)}); {len(self.unexplained)} unexplained "
            f"{self.unexplained[:5]}; {len(self.withheld)} committed records withheld "
            f"{self.withheld[:5]}"
        )


def judge_plain_view(
    topic: str, served: Sequence[tuple[int, int]], partitions: Sequence[list[RawBatch]]
) -> PlainView:
    """Classify what a plain consumer served ((partition, offset) pairs) against `partitions`,
    the raw batches of every partition of `topic` (index = partition)."""
    committed: set[tuple[int, int]] = set()
    origins: dict[tuple[int, int], RecordOrigin] = {}
    for partition, batches in enumerate(partitions):
        committed |= {(partition, r.offset) for r in apply_markers(topic, partition, batches)}
        origins.update({(partition, o): v for o, v in record_origins(partition, batches).items()})
    live = live_epochs(partitions)
    counts = collections.Counter(served)
    leaked: list[RecordOrigin] = []
    unexplained: list[str] = []
    for (partition, offset), n in sorted(counts.items()):
        where = f"p{partition}@{offset}"
        if n > 1:
            unexplained.append(f"{where} served {n} times")
        if (partition, offset) in committed:
            continue
        origin = origins.get((partition, offset))
        if origin is None:
            unexplained.append(f"{where}: no data record there in the raw log")
        elif origin.marker != ABORT_MARKER:
            unexplained.append(f"{where}: transaction marker {origin.marker!r}, not ABORT")
        elif origin.producer_epoch >= live.get(origin.producer_id, origin.producer_epoch):
            unexplained.append(
                f"{where}: under ABORT of the live producer id {origin.producer_id} epoch "
                f"{origin.producer_epoch}"
            )
        else:
            leaked.append(origin)
    withheld = sorted(committed - set(counts))
    return PlainView(leaked, unexplained, withheld)


def read_committed(
    bootstrap: str, topic: str, *, timeout: float = 10.0, holes: list[LogHole] | None = None
) -> list[CommittedRecord]:
    """All records of `topic` an Apache Kafka read_committed consumer would see now,
    ordered by (partition, offset). A hole in the log raises LogHoleError, unless `holes` is
    given: then the holes go there and the view is what the broker still serves."""
    out: list[CommittedRecord] = []
    for partition, (host, port) in sorted(_leaders(bootstrap, topic, timeout).items()):
        conn = _Connection(host, port, timeout)
        try:
            batches, _high_watermark = _fetch_all(conn, topic, partition, timeout, holes)
            out.extend(apply_markers(topic, partition, batches))
        finally:
            conn.close()
    return out


def read_committed_settled(
    bootstrap: str, topic: str, *, wait_s: float = 30.0, timeout: float = 10.0
) -> list[CommittedRecord]:
    """`read_committed` once no transaction in `topic` lacks its marker, waiting at most
    `wait_s`. For a reader that starts right after the producers stopped: a broker writes a
    transaction's markers after it answered the commit, and a read_committed consumer sees
    that transaction's records only then."""
    deadline = time.monotonic() + wait_s
    while True:
        partitions = read_raw_topic(bootstrap, topic, timeout=timeout)
        if not any(_unmarked(batches) for batches in partitions):
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return [r for p, batches in enumerate(partitions) for r in apply_markers(topic, p, batches)]


def read_with_consumer(
    bootstrap: str,
    topic: str,
    *,
    isolation_level: str = "read_committed",
    idle_s: float = 1.5,
    timeout: float = 20.0,
    fetch_wait_ms: int = 50,
) -> list[Any]:
    """What a plain confluent-kafka consumer with this isolation level receives (assign(),
    from the beginning, until nothing new arrives for `idle_s`). Returns its Messages.

    `fetch_wait_ms` is its `fetch.wait.max.ms`: short for speed; Tansu leaves unanswered a fetch
    it cannot assemble within it (README, known broker defects), so a reader that finds records
    missing asks again with a longer one, as a consumer at librdkafka's default (500) would."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"millstream-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation_level,
            "fetch.wait.max.ms": fetch_wait_ms,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: list[Any] = []
        end = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < end and time.monotonic() - last < idle_s:
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            out.append(msg)
            last = time.monotonic()
        return out
    finally:
        consumer.close()


_PROBES: dict[str, bool] = {}
_PROBE_LOCK = threading.Lock()


def probe_aborted_leak(bootstrap: str, *, timeout: float = 20.0) -> bool:
    """True when the broker serves aborted transactional records to read_committed consumers.

    Produces one record in a transaction that is flushed and aborted, then one in a committed
    transaction, on a fresh topic, and reads it with a plain confluent-kafka consumer. Apache
    Kafka: False. Tansu 0.6: True (a broker defect). Cached per bootstrap for the process.
    """
    with _PROBE_LOCK:
        if bootstrap in _PROBES:
            return _PROBES[bootstrap]
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"millstream-probe-aborted-{uuid.uuid4().hex}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=-1, config={"retention.ms": "-1"})]
    )[topic].result(timeout=timeout)
    try:
        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 0}
        )
        producer.init_transactions(timeout)
        producer.begin_transaction()
        producer.produce(topic, value=b"aborted")
        producer.flush(timeout)
        producer.abort_transaction(timeout)
        producer.begin_transaction()
        producer.produce(topic, value=b"committed")
        producer.commit_transaction(timeout)
        seen: set[bytes] = set()
        end = time.monotonic() + timeout
        while b"committed" not in seen and time.monotonic() < end:
            seen |= {m.value() for m in read_with_consumer(bootstrap, topic, idle_s=1.0)}
        if b"committed" not in seen:
            raise TransientError(f"probe: the committed record on {topic!r} never arrived")
        leak = b"aborted" in seen
    finally:
        for future in admin.delete_topics([topic]).values():
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)
    with _PROBE_LOCK:
        _PROBES[bootstrap] = leak
    return leak


def _unmarked(batches: Sequence[RawBatch]) -> list[int]:
    """Producer ids with a transaction that has no later marker of theirs in `batches`."""
    open_txns: set[int] = set()
    for batch in batches:
        if batch.control:
            open_txns.discard(batch.producer_id)
        elif batch.transactional:
            open_txns.add(batch.producer_id)
    return sorted(open_txns)


@dataclass(frozen=True)
class FetchAnswer:
    """What a broker's read_committed Fetch of one partition from one offset answered: what a
    plain consumer there is told. librdkafka hands out no record at or past the response's
    `last_stable_offset`, and skips the `aborted` transactions (producer id, first offset)."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]]


def aborted_listed(
    bootstrap: str, topic: str, partition: int, offset: int, *, timeout: float = 10.0
) -> list[tuple[int, int]]:
    """The aborted transactions (producer id, first offset) a broker lists to a read_committed
    consumer fetching `partition` from `offset`: what its Fetch tells the client to skip."""
    answer = fetch_committed(bootstrap, topic, partition, offset, timeout=timeout)
    return [] if answer is None else answer.aborted


def fetch_committed(
    bootstrap: str, topic: str, partition: int, offset: int, *, timeout: float = 10.0
) -> FetchAnswer | None:
    """The broker's answer to a read_committed Fetch of `partition` from `offset` (None when
    the response names no partition)."""
    host, port = _leaders(bootstrap, topic, timeout)[partition]
    conn = _Connection(host, port, timeout)
    try:
        version = conn.version(FetchRequest, "Fetch")
        request = FetchRequest[version](
            replica_id=-1,
            max_wait_ms=_SHORT_WAIT_MS,
            min_bytes=0,
            max_bytes=8 << 20,
            isolation_level=1,  # read_committed: the broker lists the aborted transactions
            topics=[
                FetchRequest.FetchTopic(
                    topic=topic,
                    partitions=[
                        FetchRequest.FetchTopic.FetchPartition(
                            partition=partition, fetch_offset=offset, partition_max_bytes=8 << 20
                        )
                    ],
                )
            ],
        )
        responses = conn.request(request).responses
    finally:
        conn.close()
    if not responses or not responses[0].partitions:
        return None
    part = responses[0].partitions[0]
    listed = getattr(part, "aborted_transactions", None) or []
    return FetchAnswer(
        int(part.error_code),
        int(part.high_watermark),
        int(getattr(part, "last_stable_offset", -1)),
        [(int(a.producer_id), int(a.first_offset)) for a in listed],
    )


def listed_aborted_but_committed(
    view: PlainView,
    partitions: Sequence[list[RawBatch]],
    aborted: dict[int, list[tuple[int, int]]],
) -> str | None:
    """Positive evidence that the broker withholds committed records because its Fetch lists
    their transaction as aborted while its own log marks it COMMIT; None without it.

    Every withheld record (committed data in the raw log, `judge_plain_view`) must belong to a
    producer id that the broker's read_committed Fetch (`aborted`, per partition, from
    `aborted_listed`) names in an aborted transaction starting at or before it, although the
    next marker of that producer after the record, in the same log, is COMMIT.
    """
    facts = []
    for partition in sorted({p for p, _ in view.withheld}):
        batches = partitions[partition]
        listed = aborted.get(partition, [])
        for _, offset in sorted(o for o in view.withheld if o[0] == partition):
            batch = next((b for b in batches if b.base_offset <= offset < b.next_offset), None)
            if batch is None or batch.control or not batch.transactional:
                return None
            marker = next(
                (
                    b
                    for b in batches
                    if b.control and b.producer_id == batch.producer_id and b.base_offset > offset
                ),
                None,
            )
            committed = marker is not None and any(
                getattr(r, "type", None) == 1 for r in marker.records
            )
            if not committed:
                return None
            if not any(pid == batch.producer_id and first <= offset for pid, first in listed):
                return None
        facts.append(
            f"p{partition}: the broker's read_committed Fetch lists aborted transactions "
            f"{sorted(listed)[:5]} whose producers' next markers in its log are COMMIT"
        )
    return "; ".join(facts) if facts else None


def withheld_by_broker(
    view: PlainView,
    partitions: Sequence[list[RawBatch]],
    lsos: dict[int, Any],
    *,
    answered_by: str = "ListOffsets",
) -> str | None:
    """Positive evidence that the broker, not the product, holds committed records back from a
    plain read_committed consumer; None without it.

    Per partition with withheld records, from the broker alone: its raw log has no open
    transaction (every transactional batch has a later marker of its producer), so the last
    stable offset must be the log end; yet the last stable offset it answers (`lsos`, to a
    read_committed ListOffsets request, or in a read_committed Fetch's response from the first
    withheld offset: `answered_by` says which) is at or before the first withheld record. The
    withheld records themselves must be committed data in that log (`judge_plain_view`). A
    negative offset (the protocol's "unknown") is no evidence.
    """
    facts = []
    for partition in sorted({p for p, _ in view.withheld}):
        first = min(o for p, o in view.withheld if p == partition)
        batches = partitions[partition]
        lso = lsos.get(partition)
        if not isinstance(lso, int) or lso < 0 or _unmarked(batches) or lso > first:
            return None
        end = batches[-1].next_offset if batches else 0
        facts.append(
            f"p{partition}: last stable offset {lso} ({answered_by}), no open transaction, "
            f"log end {end}"
        )
    return "; ".join(facts) if facts else None
