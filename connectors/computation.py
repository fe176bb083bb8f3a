"""The programming model: a Computation runs per key; its Context buffers effects for one commit."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from millstream.connectors.formats import FormatError, ValueFormat, encode_with
from millstream.connectors.serde import Serde, encode_value
from millstream.errors import ConfigurationError, TimestampContractError
from millstream.headers import user_headers
from millstream.records import Production, Record, TimeDomain, Timer
from millstream.state.watermarks import UNKNOWN

_MISSING = object()


class Context:
    """What user code may touch while it handles one record or timer of one key.

    Valid only during that call: every effect (state, timers, productions) is buffered and
    committed atomically with the record's id, or discarded if the call raises.
    """

    def __init__(
        self,
        key: str,
        *,
        state: bytes | None,
        serde: Serde,
        low_watermark: int,
        now: int,
        timestamp: int,
        outputs: frozenset[str],
        new_id: Callable[[], bytes] = lambda: uuid.uuid4().bytes,
        cause: str = "the record",
        allowed_skew_ms: int = 0,
        output_watermark: int = UNKNOWN,
        formats: Mapping[str, ValueFormat] | None = None,
    ) -> None:
        self.key = key
        self.low_watermark = low_watermark
        self.now = now
        self._serde = serde
        self._raw = state
        self._value: Any = _MISSING
        self._dirty = False
        self._encoded: tuple[bool, bytes | None] | None = None
        # The timestamp contract: productions are stamped no earlier than their cause (the
        # record's timestamp, or the timer's output time), less the computation's allowed skew.
        self._timestamp = timestamp
        self._cause = cause
        self._skew = allowed_skew_ms
        # This computation's low watermark as its consumers last saw it: a hold at or after it
        # can still be honoured; one before it cannot (watermarks never go back).
        self._output_watermark = output_watermark
        self._outputs = outputs
        self._formats = formats or {}  # output stream -> the format its values are encoded in
        self._new_id = new_id
        # tag -> (domain, time, hold) to set, or None to delete
        self.timer_ops: dict[str, tuple[TimeDomain, int, int | None] | None] = {}
        self.productions: list[Production] = []
        # Counters an operator raises during the call: applied with its effects, so a call
        # that is retried or fails counts nothing.
        self.counters: dict[str, int] = {}

    # --- state -------------------------------------------------------------------------------
    def get_state(self, default: Any = None) -> Any:
        """This key's state, or `default` when the key has none."""
        if self._value is _MISSING:
            self._value = None if self._raw is None else self._serde.loads(self._raw)
        return default if self._value is None else self._value

    def set_state(self, value: Any) -> None:
        if value is None:
            raise ValueError("set_state(None) is ambiguous: call delete_state() to remove state")
        self._value = value
        self._dirty = True
        self._encoded = None

    def delete_state(self) -> None:
        self._value = None
        self._dirty = True
        self._encoded = None

    def state_effect(self) -> tuple[bool, bytes | None]:
        """(changed, bytes or None for delete); serialising here makes a bad value a user error.

        Encoded once: the runtime asks right after user code (to catch an unencodable value)
        and again when it writes the commit.
        """
        if not self._dirty:
            return False, None
        if self._encoded is None:
            self._encoded = (True, None if self._value is None else self._serde.dumps(self._value))
        return self._encoded

    # --- timers ------------------------------------------------------------------------------
    def set_timer(
        self,
        tag: str,
        time: int,
        domain: str | TimeDomain = TimeDomain.EVENT,
        *,
        hold: int | None = None,
    ) -> None:
        """Fire `process_timer` once when the clock of `domain` reaches `time` (ms).

        event: when the input low watermark passes `time`; wall: when the wall clock does.
        Setting a tag again moves the timer (and replaces its hold).

        `hold` (event timers): until the timer fires or is deleted, this computation's low
        watermark stays at or below `hold`, so the firing may produce records stamped at
        `hold` or later (a window result stamped at the window's start) without their being
        late downstream. It must be at or before `time`, and at or after this computation's
        published low watermark (always true for a hold at or after an on-time record's
        timestamp, or at a hold the same timer already had).
        """
        parsed = TimeDomain.parse(domain)
        if not isinstance(time, int) or isinstance(time, bool):
            raise TypeError(f"timer time must be int milliseconds, got {type(time).__name__}")
        if hold is not None:
            if parsed is not TimeDomain.EVENT:
                raise ValueError(f"timer {tag!r}: hold= applies to event-time timers only")
            if not isinstance(hold, int) or isinstance(hold, bool):
                raise TypeError(f"timer hold must be int milliseconds, got {type(hold).__name__}")
            if hold > time:
                raise ValueError(f"timer {tag!r}: hold {hold} is after the timer's time {time}")
            if hold < self._output_watermark:
                raise TimestampContractError(
                    f"timer {tag!r}: hold {hold} is behind this computation's low watermark "
                    f"{self._output_watermark}, which its consumers have already seen: output "
                    f"stamped there would be late downstream. Hold at {self._output_watermark} "
                    f"or later (e.g. at the record's timestamp)"
                )
        self.timer_ops[str(tag)] = (parsed, time, hold)

    def delete_timer(self, tag: str) -> None:
        self.timer_ops[str(tag)] = None

    # --- productions -------------------------------------------------------------------------
    def produce(
        self,
        stream: str,
        key: str,
        value: bytes | str | Any,
        timestamp: int | None = None,
        *,
        headers: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None = None,
    ) -> None:
        """Emit a record to `stream`; delivered after this key's effects are committed.

        `timestamp` defaults to the cause's (the record's, or the timer's output time) and may
        not be earlier than it (MillWheel 4.5): an earlier one would be behind this
        computation's low watermark, late for every consumer. Raises TimestampContractError.

        `value`: bytes as they are; on a stream with a value format, anything else is encoded
        by it (FormatError if it cannot be); otherwise str as UTF-8, anything else as JSON.
        `headers` (a mapping or (name, value) pairs): written as Kafka headers after
        millstream's own and seen by consumers as `record.headers`; names may not start with
        `ms-`, values are bytes or str (UTF-8).
        """
        if stream not in self._outputs:
            raise ConfigurationError(
                f"produce() to undeclared stream {stream!r}: add it to this computation's "
                f"outputs (declared: {sorted(self._outputs)})"
            )
        ts = self._timestamp if timestamp is None else int(timestamp)
        if ts < self._timestamp - self._skew:
            raise TimestampContractError(
                f"produce() to {stream!r} stamped {ts}, earlier than its cause ({self._cause}, "
                f"at {self._timestamp}) by {self._timestamp - ts} ms (allowed skew "
                f"{self._skew} ms): downstream it would be late. Stamp it at or after "
                f"{self._timestamp - self._skew}, or set the timer with hold=<earlier time> "
                f"to hold the watermark there"
            )
        fmt = self._formats.get(stream)
        if fmt is None:
            encoded = encode_value(value)
        else:
            try:
                encoded = encode_with(fmt, value)
            except FormatError as exc:
                raise FormatError(f"produce() to {stream!r}: value {exc}") from exc.__cause__
        self.productions.append(
            Production(
                stream=stream,
                key=str(key),
                value=encoded,
                timestamp=ts,
                id=self._new_id(),
                system_time=self.now,
                headers=user_headers(headers),
            )
        )


class Computation(ABC):
    """User logic for one node of the topology, run per key, serialised per key.

    millstream calls `process_record` once per input record (exactly once in effect, even when
    Kafka redelivers or a worker crashes) and `process_timer` once per timer that came due.
    """

    @abstractmethod
    def process_record(self, ctx: Context, record: Record) -> None:
        """Handle one record of `ctx.key`."""

    def process_timer(self, ctx: Context, timer: Timer) -> None:  # noqa: B027 - optional hook
        """Handle a timer of `ctx.key` that came due; does nothing unless overridden."""
