"""A topology declared in Python: streams, their injectors, computations and sinks.

Validated before anything starts, with errors that say what to change.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from millstream.connectors.combiners import Combiner
from millstream.connectors.computation import Computation
from millstream.connectors.formats import JsonFormat, ValueFormat
from millstream.connectors.join_log import DEFAULT_LOG, JoinLog
from millstream.connectors.operator import ComputationOperator, Operator
from millstream.connectors.serde import SERDES
from millstream.connectors.windows import WindowKind
from millstream.errors import ConfigurationError
from millstream.injectors.sources import Source

KeyExtractor = Callable[[bytes | None, bytes], str]
DEAD_LETTERS = "dead-letters"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def record_key(key: bytes | None, value: bytes) -> str:
    """The default key extractor: the Kafka record key, which must be UTF-8."""
    if key is None:
        raise ValueError("record has no key: declare a key extractor for this stream")
    return key.decode("utf-8")


def json_field(name: str) -> KeyExtractor:
    """A key extractor that reads one field of a JSON object value (on a stream declared with
    `json_format()`, from the value decoded once for the record)."""
    return JsonFormat().field(name)


@dataclass(frozen=True)
class ComputationOptions:
    """MillWheel section 6.1.3 knobs, per computation."""

    exactly_once: bool = True
    productions: Literal["strong", "weak"] = "strong"
    # Late records (behind the input low watermark; for a window, past its allowed lateness):
    # counted, then dropped, handed to user code flagged (`record.late`), or dead-lettered.
    late: Literal["drop", "flag", "dead-letter"] = "drop"
    shards: int | None = None  # None: MILLSTREAM_SHARDS
    serde: str = "json"
    start: Literal["earliest", "latest"] = "earliest"
    use_bloom: bool = True
    # The timestamp contract (MillWheel 4.5, Beam's allowed skew): a production may be stamped
    # at most this many ms earlier than its cause. Output stamped earlier than the cause can be
    # late downstream; raise it only where consumers tolerate that.
    allowed_timestamp_skew_ms: int = 0

    def validate(self, name: str) -> None:
        if self.productions not in ("strong", "weak"):
            raise ConfigurationError(
                f"computation {name!r}: productions must be 'strong' or 'weak'"
            )
        if self.late not in ("drop", "flag", "dead-letter"):
            raise ConfigurationError(
                f"computation {name!r}: late must be 'drop', 'flag' or 'dead-letter'"
            )
        if self.shards is not None and not 1 <= self.shards <= 4096:
            raise ConfigurationError(f"computation {name!r}: shards must be 1-4096")
        if self.serde not in SERDES:
            raise ConfigurationError(
                f"computation {name!r}: unknown serde {self.serde!r}; use one of {sorted(SERDES)}"
            )
        if self.start not in ("earliest", "latest"):
            raise ConfigurationError(f"computation {name!r}: start must be 'earliest' or 'latest'")
        skew = self.allowed_timestamp_skew_ms
        if not isinstance(skew, int) or isinstance(skew, bool) or skew < 0:
            raise ConfigurationError(
                f"computation {name!r}: allowed_timestamp_skew_ms must be an int >= 0, got {skew!r}"
            )


@dataclass(frozen=True)
class ComputationSpec:
    name: str
    computation: Computation | Operator  # a hand-written computation, or another operator
    inputs: Mapping[str, KeyExtractor]
    outputs: frozenset[str]
    options: ComputationOptions
    # The value formats of its input and output streams that have one (Topology.stream_format):
    # inputs are decoded with them, productions encoded.
    formats: Mapping[str, ValueFormat] = field(default_factory=dict)

    @property
    def operator(self) -> Operator:
        """What the shard task calls (`connectors/operator.py`)."""
        if isinstance(self.computation, Operator):
            return self.computation
        return ComputationOperator(self.computation)


@dataclass
class Topology:
    """The application graph. Build it, then hand it to `millstream.run`."""

    app: str
    sources: dict[str, list[Source]] = field(default_factory=dict)
    computations: dict[str, ComputationSpec] = field(default_factory=dict)
    sinks: dict[str, Any] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)
    out_of_order_ms: dict[str, int] = field(default_factory=dict)
    published: set[str] = field(default_factory=set)
    formats: dict[str, ValueFormat] = field(default_factory=dict)

    def source(
        self,
        stream: str,
        *sources: Source,
        max_out_of_order_ms: int = 0,
        value_format: ValueFormat | None = None,
    ) -> Topology:
        """Declare an injected stream fed by one or more injectors (e.g. two datacenters).

        `max_out_of_order_ms` bounds how far behind each other records of the stream may
        arrive; the injectors' watermark estimate is held back by it, so such records are not
        late. Records later than that are late (dropped and counted, or flagged).
        `value_format`: see `stream_format`.
        """
        _check_name("stream", stream)
        if max_out_of_order_ms < 0:
            raise ConfigurationError(f"stream {stream!r}: max_out_of_order_ms must be >= 0")
        self.out_of_order_ms[stream] = int(max_out_of_order_ms)
        if not sources:
            raise ConfigurationError(f"stream {stream!r}: give at least one source")
        if stream in self.sources:
            raise ConfigurationError(f"stream {stream!r} is declared twice")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"stream {stream!r}: source names must differ, got {names}")
        if value_format is not None:
            self.stream_format(stream, value_format)
        self.sources[stream] = list(sources)
        return self

    def stream_format(self, stream: str, value_format: ValueFormat) -> Topology:
        """Declare how values of `stream` (injected or produced) are encoded: each record's
        value is decoded once into `record.data` (a value that does not decode is a dead
        letter), and values produced to it are encoded (bytes are taken as already encoded)."""
        _check_name("stream", stream)
        if stream == DEAD_LETTERS:
            raise ConfigurationError(
                f"stream {stream!r}: dead letters are millstream's own JSON; it takes no format"
            )
        if not isinstance(value_format, ValueFormat):
            raise ConfigurationError(
                f"stream {stream!r}: expected a value format such as json_format() or "
                f"avro_format(schema), got {value_format!r}"
            )
        known = self.formats.get(stream)
        if known is not None and known != value_format:
            raise ConfigurationError(
                f"stream {stream!r} already has format {known.describe()}; a stream has one"
            )
        self.formats[stream] = value_format
        self._bind_formats()
        return self

    def _bind_formats(self) -> None:
        """Give each computation the formats of its streams (its spec travels to executors
        without the topology), whichever of the two was declared first."""
        for name, spec in self.computations.items():
            streams = [*spec.inputs, *sorted(spec.outputs)]
            formats = {s: self.formats[s] for s in streams if s in self.formats}
            if formats != dict(spec.formats):
                self.computations[name] = dataclasses.replace(spec, formats=formats)

    def computation(
        self,
        name: str,
        computation: Computation | Operator,
        *,
        inputs: Mapping[str, KeyExtractor | None] | Sequence[str],
        outputs: Sequence[str] = (),
        options: ComputationOptions | None = None,
        **option_overrides: Any,
    ) -> Topology:
        """Add a computation: inputs map each stream to this consumer's key extractor."""
        _check_name("computation", name)
        if name in self.computations:
            raise ConfigurationError(f"computation {name!r} is declared twice")
        if not isinstance(computation, Computation | Operator):
            raise ConfigurationError(
                f"computation {name!r}: expected a Computation instance, got {computation!r}"
            )
        if not isinstance(inputs, Mapping):
            inputs = dict.fromkeys(inputs)
        if not inputs:
            raise ConfigurationError(f"computation {name!r} has no input streams")
        extractors = {s: (fn or record_key) for s, fn in inputs.items()}
        opts = options or ComputationOptions()
        if option_overrides:
            try:
                opts = ComputationOptions(**{**opts.__dict__, **option_overrides})
            except TypeError as exc:
                raise ConfigurationError(f"computation {name!r}: {exc}") from None
        opts.validate(name)
        spec_operator = (
            computation if isinstance(computation, Operator) else ComputationOperator(computation)
        )
        if opts.late not in spec_operator.late_policies:
            raise ConfigurationError(
                f"computation {name!r}: late={opts.late!r} does not apply to a "
                f"{type(spec_operator).__name__}; use one of {list(spec_operator.late_policies)}"
            )
        for stream in outputs:
            _check_name("stream", stream)
        self.computations[name] = ComputationSpec(
            name, computation, extractors, frozenset(outputs) | {DEAD_LETTERS}, opts
        )
        self._bind_formats()
        return self

    def window(
        self,
        name: str,
        *,
        stream: str,
        window: WindowKind,
        aggregate: Combiner,
        output: str,
        key: KeyExtractor | None = None,
        allowed_lateness_ms: int = 0,
        lift: bool = True,
        **option_overrides: Any,
    ) -> Topology:
        """Add a windowed aggregation of `stream` per key (`key`: its key extractor; default
        the Kafka record key): each window (`Tumbling`, `Hopping`, `Session`) is aggregated by
        `aggregate` (`Count()`, `Sum(field)`, `Min`, `Max`, `Mean`, or a `Combiner`) and
        produced once to `output` when the low watermark passes its end, stamped at its end:
        value `{"key", "start", "end", "result", "update"}`, keyed by the key.

        `allowed_lateness_ms`: a window is kept that long after its end; a late record within
        it updates the window, which is produced again with `"update": true`. Records past it
        are late: counted, then dropped (`late="drop"`, the default) or dead-lettered
        (`late="dead-letter"`). `lift=False` merges each record into state on its own instead
        of a batch's records at once (the same results; for comparison). Other keyword
        arguments are `ComputationOptions` (shards, serde, exactly_once, ...).
        """
        from millstream.connectors.window_operator import WindowOperator

        if not isinstance(window, WindowKind):
            raise ConfigurationError(
                f"window {name!r}: window must be Tumbling(size_ms), Hopping(size_ms, every_ms) "
                f"or Session(gap_ms), got {window!r}"
            )
        if not isinstance(aggregate, Combiner):
            raise ConfigurationError(
                f"window {name!r}: aggregate must be Count(), Sum(field), Min(field), "
                f"Max(field), Mean(field) or a Combiner, got {aggregate!r}"
            )
        lateness = allowed_lateness_ms
        if not isinstance(lateness, int) or isinstance(lateness, bool) or lateness < 0:
            raise ConfigurationError(
                f"window {name!r}: allowed_lateness_ms must be an int >= 0, got {lateness!r}"
            )
        operator = WindowOperator(
            window, aggregate, output, allowed_lateness_ms=lateness, lift=bool(lift)
        )
        return self.computation(
            name, operator, inputs={stream: key}, outputs=[output], **option_overrides
        )

    def join(
        self,
        name: str,
        *,
        primary: str,
        primary_id: KeyExtractor,
        secondary: str,
        secondary_id: KeyExtractor,
        lookup: KeyExtractor,
        combine: Callable[[Any, bytes], Any],
        output: str,
        unjoined: str = "unjoined",
        registry: str | None = None,
        registry_url: str | None = None,
        retry: Any = None,
        cache_ttl_s: int = 3600,
        max_waiting: int | None = 10_000,
        log: JoinLog | None = DEFAULT_LOG,
        lookup_time: Callable[[Any], int] | None = None,
        **option_overrides: Any,
    ) -> Topology:
        """Photon's join (`connectors/join_operator.py`): each `primary` event (a click, its
        id read by `primary_id`) is joined with the `secondary` event (a query, its id read by
        `secondary_id`) that `lookup` names in it, found in the event store; `combine(click
        record, query bytes)` gives the joined value, produced to `output` keyed by the click
        id and stamped at its time. A click whose query is not there yet waits (`retry`, a
        `JoinRetry`), then goes to `unjoined` with the reason. Output is delivered only after
        the click id is inserted in the IdRegistry `registry` (default: the join's name) at
        `registry_url` (default REDIS_URL): at most one joined output per click across every
        pipeline sharing it. Declares two computations: `<name>-store` and `<name>`.
        While a joiner shard holds more than `max_waiting` waiting clicks, new clicks are not
        read (the queries are) until retries bring it under (None: no bound).
        A query missing from the cache once `cache_ttl_s` has passed since its time
        (`lookup_time(click record)` in ms, else the click's time) is looked for in the
        secondary stream's Kafka topics, `log` (a `JoinLog`) either side of that time: the
        event store's log tier (`connectors/join_log.py`; `log=None`: cache only).
        """
        from millstream.connectors.join_declaration import declare_join

        declare_join(
            self, name, primary=primary, primary_id=primary_id, secondary=secondary,
            secondary_id=secondary_id, lookup=lookup, combine=combine, output=output,
            unjoined=unjoined, registry=registry or name, registry_url=registry_url,
            retry=retry, cache_ttl_s=cache_ttl_s, max_waiting=max_waiting,
            options=option_overrides, log_tier=log, lookup_time=lookup_time,
        )  # fmt: skip
        return self

    def sink(self, stream: str, sink: Any) -> Topology:
        """Deliver a stream's productions to an external target (exactly-once where it allows)."""
        if stream in self.sinks:
            raise ConfigurationError(f"stream {stream!r} already has a sink")
        self.sinks[stream] = sink
        return self

    def publish(self, stream: str) -> Topology:
        """Write a produced stream to its Kafka topic (`topic_of`) even where only computations
        of this application consume it: for readers outside it (another application, a
        computation added later that starts from the earliest record)."""
        self.published.add(stream)
        return self

    # --- queries -----------------------------------------------------------------------------
    def producer_of(self, stream: str) -> list[str]:
        return [c.name for c in self.computations.values() if stream in c.outputs]

    def consumers_of(self, stream: str) -> list[str]:
        return [c.name for c in self.computations.values() if stream in c.inputs]

    def internal_streams(self) -> list[str]:
        """Streams produced by computations: each is a Kafka topic named by `topic_of`."""
        out: set[str] = set()
        for spec in self.computations.values():
            out |= spec.outputs
        return sorted(out)

    def topic_of(self, stream: str) -> str:
        return f"{self.app}.{stream}"

    def validate(self) -> None:
        """Raise ConfigurationError for unknown streams, cycles without input, bad sinks."""
        _check_name("app", self.app)
        if not self.computations:
            raise ConfigurationError(
                "the topology has no computations: add one with .computation()"
            )
        produced = set(self.internal_streams())
        for spec in self.computations.values():
            for stream in spec.inputs:
                if stream not in self.sources and stream not in produced:
                    raise ConfigurationError(
                        f"computation {spec.name!r} reads unknown stream {stream!r}: declare it "
                        f"with .source() or as another computation's output"
                    )
                if stream in self.sources and stream in produced:
                    raise ConfigurationError(
                        f"stream {stream!r} is both injected and produced: rename one of them"
                    )
        for spec in self.computations.values():
            for stream in spec.operator.gated_streams:
                readers = self.consumers_of(stream)
                if readers:
                    raise ConfigurationError(
                        f"computations {readers} read {stream!r}, which {spec.name!r} delivers "
                        "only after its registry insert: read it from its topic in another "
                        "application"
                    )
            if spec.options.productions == "weak":
                external = sorted(s for s in spec.outputs if s in self.sinks)
                if external:
                    raise ConfigurationError(
                        f"computation {spec.name!r}: weak productions go only to internal "
                        f"streams, but {external} have sinks; use productions='strong'"
                    )
        for stream in sorted(set(self.formats) - produced - set(self.sources)):
            raise ConfigurationError(
                f"stream_format({stream!r}): no such stream; declare it with .source() or as "
                f"a computation's output"
            )
        for stream in sorted(self.published - produced):
            raise ConfigurationError(
                f"publish({stream!r}): no computation produces it; add it to one's outputs"
            )
        for stream in self.sinks:
            if stream not in produced:
                raise ConfigurationError(
                    f"sink on stream {stream!r}, which no computation produces: "
                    f"add it to a computation's outputs"
                )


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"{kind} name {name!r} is invalid: use letters, digits, '_', '.', '-' (max 100)"
        )
