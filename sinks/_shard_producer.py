"""A shard's transactional producer and the state machine of its open transaction.

States: idle → `begin` → in a transaction → `commit` → idle; `abort` returns to idle. A commit
whose outcome librdkafka could not tell (it timed out) leaves the producer *in doubt*
(`committing` set): such a producer is never aborted or dropped, and its next delivery resumes
the commit first (librdkafka's contract for a timed-out `commit_transaction`), until the
transaction timeout has certainly settled the outcome (`doubt_outlived`). When a resumed
commit succeeds, `commit` says it was in doubt, and the sink checks the broker's progress
offsets agree (they do on Apache Kafka; the log names a broker where they do not). A producer
that is fenced, fatal or stuck is dropped (`drop`); the next delivery initialises the
transactional id again, which aborts whatever it left open.

Errors of librdkafka's transactional calls are sorted into `Fenced` (a newer producer took the
transactional id), `Abortable` (abort and try again) and the sink's MillstreamErrors.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer

from millstream.errors import ConfigurationError, TransientError
from millstream.kafka_errors import classify, is_fenced, kafka_error
from millstream.sinks._kafka import Deadline, purge_quietly
from millstream.sinks.base import ShardRef

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.1
_STUCK_GRACE_S = 5.0
_FLUSH_SLICE_S = 0.5


class Fenced(Exception):
    """Kafka fenced the cached producer; the caller decides between re-init and FencedError."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


class Abortable(Exception):
    """The transaction failed but the producer is fine: abort it and try again."""

    def __init__(self, err: KafkaError, what: str) -> None:
        super().__init__(f"{what}: {err.name()} ({err.str()})")
        self.err = err


@dataclass
class ShardProducer:
    """A shard's producer in this process, and what it knows since its init_transactions.

    `forget` is called when the producer is dropped: it removes it from the cache that holds it.
    """

    producer: Producer
    txn_id: str
    progress: dict[str, int] = field(default_factory=dict)  # stream -> highest delivered seq
    group_meta: dict[str, Any] = field(default_factory=dict)  # stream -> ConsumerGroupMetadata
    in_transaction: bool = False
    # Set while a commit_transaction call has not returned a definite outcome: the progress
    # (stream -> seq) that transaction carries. Such a producer is never aborted or dropped:
    # its next delivery resumes the commit first (librdkafka's contract for a timed-out commit).
    committing: dict[str, int] | None = None
    committing_since: float = 0.0  # monotonic time the in-doubt commit was first attempted
    doubted: bool = False  # the commit under way has timed out at least once
    forget: Callable[[ShardProducer], None] | None = None

    # ------------------------------------------------------------------------- transitions
    def begin(self) -> None:
        self.call("begin_transaction", self.producer.begin_transaction)
        self.in_transaction = True

    def commit(self, shard: ShardRef, deadline: Deadline, top: dict[str, int]) -> bool:
        """Commit (or resume committing) the open transaction that carries progress `top`.

        Returns whether the commit was in doubt before it succeeded: the caller then compares
        it with the broker's progress offsets, because librdkafka's success after a timeout is
        only the answer to a re-sent EndTxn, which a broker that lost the transaction across a
        restart may give too.

        A commit that times out has an unknown outcome: the broker may have committed it. Then
        aborting is not allowed (librdkafka answers _CONFLICT) and dropping the producer would
        leave the outcome to the progress read of the next producer. So the producer is kept
        with `committing` set, and the next delivery of the shard calls commit_transaction
        again until librdkafka returns a definite result (docs of rd_kafka_commit_transaction).
        """
        if self.committing is None:
            self.committing, self.committing_since = top, time.monotonic()
        while True:
            try:
                self.producer.commit_transaction(max(0.1, deadline.left()))
                break
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not err.txn_requires_abort():
                    self.doubted = True
                    if not deadline.expired():
                        time.sleep(RETRY_PAUSE_S)
                        continue
                    raise TransientError(
                        f"shard {shard}: commit_transaction for {self.txn_id!r} did not return "
                        f"within {deadline.seconds:.0f}s ({err.name()}); its outcome is unknown, "
                        "so the checkpoints stay and the next delivery resumes the commit"
                    ) from None
                self.committing, self.doubted = None, False  # definite: it did not commit
                self.fail(exc, "commit_transaction")
        doubted = self.doubted
        self.committing, self.doubted = None, False
        self.in_transaction = False
        for stream, seq in top.items():
            self.progress[stream] = max(self.progress[stream], seq)
        return doubted

    def doubt_outlived(self, transaction_timeout_s: float) -> bool:
        """A commit in doubt for longer than the transaction timeout: stop resuming it.

        By then the coordinator has finished that transaction one way or the other (a commit
        it started completes; one it never saw is aborted by the timeout), so a new producer's
        init_transactions and progress read give the answer, and a resume that keeps timing out
        cannot hold the shard forever.
        """
        if self.committing is None:
            return False
        if time.monotonic() - self.committing_since <= transaction_timeout_s:
            return False
        log.warning(
            "%s: commit in doubt for over %.0fs; re-initialising the producer, whose progress "
            "read settles what was delivered",
            self.txn_id,
            transaction_timeout_s,
        )
        return True

    def abort(self, shard: ShardRef, deadline: Deadline) -> None:
        """Abort the open transaction so the next attempt starts clean.

        Raises Fenced when the abort reveals a newer producer; any other failure drops the
        producer (Kafka aborts its transaction when the id is initialised again) and raises.
        """
        if not self.in_transaction or self.committing is not None:
            return
        while True:
            try:
                self.producer.abort_transaction(max(1.0, deadline.left()))
                self.in_transaction = False
                return
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not deadline.expired():
                    time.sleep(RETRY_PAUSE_S)
                    continue
                if err is not None and is_fenced(err):
                    raise Fenced(err) from None
                self.drop()
                raise TransientError(
                    f"shard {shard}: aborting the transaction failed ({exc}); the producer was "
                    "dropped and the next delivery re-initialises it, which aborts the transaction"
                ) from None

    def abort_quietly(self, deadline: Deadline) -> None:
        """Best effort on the way out of an error: abort, else drop the producer. A producer
        whose commit is in doubt is kept as it is, for the next delivery to resume."""
        if not self.in_transaction or self.committing is not None:
            return
        try:
            self.producer.abort_transaction(max(1.0, deadline.left()))
            self.in_transaction = False
        except (KafkaException, SystemError):
            self.drop()

    def drop(self) -> None:
        """Forget a producer that is fenced, fatal or stuck; the next call re-initialises."""
        if self.forget is not None:
            self.forget(self)
        self.close()

    def close(self) -> None:
        # Never deliver what a dropped producer still queues: it belongs to an aborted transaction.
        purge_quietly(self.producer)
        self.in_transaction = False

    def await_acks(
        self,
        shard: ShardRef,
        outcomes: Sequence[tuple[int, int] | KafkaError | None],
        todo: Sequence[tuple[int, str, Any]],
        deadline: Deadline,
    ) -> None:
        """Wait until every record of the open transaction (`todo`: index into `outcomes`,
        topic, production) is acknowledged; a failed record fails the transaction."""
        while any(outcomes[i] is None for i, _, _ in todo):
            if deadline.expired():
                raise Abortable(
                    KafkaError(KafkaError._TIMED_OUT, "records unacknowledged"),
                    f"shard {shard}: waiting for acknowledgements",
                )
            self.call("flush", lambda: self.producer.flush(min(_FLUSH_SLICE_S, deadline.left())))
        for i, topic, _ in todo:
            outcome = outcomes[i]
            if not isinstance(outcome, KafkaError):
                continue
            what = f"delivering to {topic!r}"
            if is_fenced(outcome) or outcome.fatal():
                self.fail_with(outcome, what)
            error = classify(outcome, f"{self.txn_id}: {what}")
            if isinstance(error, ConfigurationError):
                raise error
            # Purged or timed-out records: abort. The abort itself reveals a fenced producer.
            raise Abortable(outcome, f"{self.txn_id}: {what}")

    # ------------------------------------------------------------------------- calls
    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (KafkaException, SystemError) as exc:
            self.fail(exc, what)

    def retrying(self, deadline: Deadline, what: str, fn: Callable[[], Any]) -> None:
        """Repeat a transactional call while librdkafka says it is retriable (its contract)."""
        while True:
            try:
                fn()
                return
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                if err is not None and err.retriable() and not deadline.expired():
                    time.sleep(RETRY_PAUSE_S)
                    continue
                self.fail(exc, what)

    def bounded(self, shard: ShardRef, deadline: Deadline, call: Callable[[], Any]) -> None:
        """Run a transactional call that may ignore its own timeout, and give up on it.

        librdkafka's send_offsets_to_transaction can block forever while the group coordinator
        is unreachable (confluentinc/librdkafka#5456, #5511). The call runs in a helper thread;
        if it has not returned `_STUCK_GRACE_S` after the delivery deadline, the producer is
        dropped (its thread stays blocked: a bounded leak, instead of a shard that never
        delivers again) and the delivery fails as retriable. The next delivery initialises the
        transactional id again, which aborts the transaction.
        """
        box: dict[str, BaseException] = {}

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # re-raised in the calling thread
                box["error"] = exc

        helper = threading.Thread(target=run, name=f"millstream-txn-{self.txn_id}", daemon=True)
        helper.start()
        helper.join(deadline.left() + _STUCK_GRACE_S)
        if helper.is_alive():
            self.drop()
            raise TransientError(
                f"shard {shard}: send_offsets_to_transaction did not return within "
                f"{deadline.seconds + _STUCK_GRACE_S:.0f}s although given "
                f"{deadline.seconds:.0f}s (a librdkafka defect while the group coordinator is "
                "unreachable); the producer was dropped and the checkpoints stay for the next "
                "delivery"
            )
        if "error" in box:
            raise box["error"]

    # ------------------------------------------------------------------------- errors
    def fail(self, exc: BaseException, what: str) -> NoReturn:
        """Raise the error for a failed call: Fenced, Abortable or the sink's error."""
        err = kafka_error(exc)
        if err is None:
            raise exc
        self.fail_with(err, what)

    def fail_with(self, err: KafkaError, what: str) -> NoReturn:
        if is_fenced(err):
            raise Fenced(err)
        if err.fatal():
            self.drop()
            raise classify(err, f"{self.txn_id}: {what} (fatal, producer dropped)")
        if err.txn_requires_abort() or err.retriable() or err.code() == KafkaError._TIMED_OUT:
            raise Abortable(err, f"{self.txn_id}: {what}")
        raise classify(err, f"{self.txn_id}: {what}")


def init_shard_producer(
    config: dict[str, Any],
    shard: ShardRef,
    deadline: Deadline,
    forget: Callable[[ShardProducer], None] | None = None,
) -> ShardProducer:
    """A new producer for `config` (its transactional.id a shard's) after init_transactions,
    which aborts the previous owner's open transaction and fences it. Retriable errors are
    retried until `deadline`; a timeout names the usual cause (a coordinator that cannot
    place its transaction log)."""
    txn_id = str(config["transactional.id"])
    producer = Producer(config)
    state = ShardProducer(producer, txn_id, forget=forget)
    while True:
        try:
            producer.init_transactions(max(0.1, deadline.left()))
            return state
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.retriable() and not deadline.expired():
                time.sleep(RETRY_PAUSE_S)
                continue
            state.close()
            if err is None:
                raise
            if err.code() == KafkaError._TIMED_OUT:
                raise TransientError(
                    f"shard {shard}: init_transactions for {txn_id!r} timed out after "
                    f"{deadline.seconds:.0f}s: the transaction coordinator is unavailable (on a "
                    "single-broker Kafka set transaction.state.log.replication.factor=1 and "
                    "transaction.state.log.min.isr=1)"
                ) from None
            raise classify(err, f"shard {shard}: init_transactions") from None


class ShardProducers:
    """Per-process LRU of shard producers: each holds threads and sockets, so the count is capped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[tuple[int, Any, str], ShardProducer] = (
            collections.OrderedDict()
        )
        self._owners: dict[tuple[int, Any, str], threading.Lock] = {}

    def owner(self, config_key: Any, txn_id: str) -> threading.Lock:
        """The lock a delivery of this shard holds for its whole call: two at once in one
        process (a failed batch's settlement still running beside its re-run's) would share
        the shard's producer and its open transaction. Per process: a forked worker does not
        inherit a lock its parent held."""
        with self._lock:
            return self._owners.setdefault((os.getpid(), config_key, txn_id), threading.Lock())

    def get(self, config_key: Any, txn_id: str) -> ShardProducer | None:
        key = (os.getpid(), config_key, txn_id)
        with self._lock:
            state = self._items.get(key)
            if state is not None:
                self._items.move_to_end(key)
            return state

    def put(self, config_key: Any, state: ShardProducer, cap: int) -> list[ShardProducer]:
        """Store and return the least recently used entries pushed over the cap."""
        pid = os.getpid()
        with self._lock:
            self._items[(pid, config_key, state.txn_id)] = state
            mine = [k for k in self._items if k[0] == pid and k[1] == config_key]
            return [self._items.pop(k) for k in mine[: max(0, len(mine) - cap)]]

    def pop(self, config_key: Any, txn_id: str) -> ShardProducer | None:
        with self._lock:
            return self._items.pop((os.getpid(), config_key, txn_id), None)

    def forget(self, config_key: Any, state: ShardProducer) -> None:
        """Remove a dropped producer (its `forget`, bound to its sink's config key)."""
        self.pop(config_key, state.txn_id)

    def drain(self, config_key: Any, txn_ids: Collection[str]) -> list[ShardProducer]:
        """Remove and return this process's producers of `txn_ids` under `config_key`."""
        pid = os.getpid()
        with self._lock:
            keys = [
                k for k in self._items if k[0] == pid and k[1] == config_key and k[2] in txn_ids
            ]
            return [self._items.pop(k) for k in keys]
