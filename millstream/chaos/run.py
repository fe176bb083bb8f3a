"""The chaos run: traffic in, a seeded schedule of faults, then verification by record id.

1. start a durable Redis (append-only file) and a broker: by default the in-memory embedded
   broker behind a TcpProxy (the broker-outage fault cuts every connection), or with
   `broker="durable"` Tansu on S3 storage, which restart-broker kills and restarts with its
   data (that storage is slow: keep the rate low, about 20 events/s);
2. start the pipeline (`millstream.chaos.worker`) in its own process group;
3. send events at a fixed rate while the schedule injects faults, waiting after each for the
   pipeline to make progress again (the recovery time);
4. read the input topic back: its distinct ids are the ground truth; wait until every one of
   them reached the output, then stop the pipeline;
5. compare by id what a read_committed reader sees in the output (marker-aware: the embedded
   broker serves aborted records to plain consumers), and each key's state with the truth;
6. judge what a plain read_committed consumer saw against the raw log (only records under an
   ABORT marker of a fenced producer may be extra, and only on a broker caught serving aborted
   data) and count the pipeline exits the harness did not cause: both are part of the verdict.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millstream.chaos.traffic import EventSender
from millstream.testing.faults import (
    FAULT_KINDS,
    Fault,
    PipelineProcess,
    duplicate_delivery,
    fault_schedule,
    kill_python_worker,
    pause_python_worker,
    restart_service,
)
from millstream.testing.verify import compare_ids

if TYPE_CHECKING:
    from millstream.testing.committed_reader import PlainView

PARTITIONS = 4
STAGES = ("route", "count")


@dataclass(frozen=True)
class ChaosOptions:
    duration: float = 120.0
    rate: float = 100.0
    keys: int = 50
    seed: int = 7
    every: float = 20.0
    faults: tuple[str, ...] = tuple(k for k in FAULT_KINDS if k != "restart-broker")
    broker: str = "memory"  # or "durable": Tansu on S3 storage, which restart-broker needs
    shards: int = 4
    output: Path = Path(".millstream/chaos")
    drain_timeout: float = 300.0
    # Pipeline exits the harness did not cause (it restarts the pipeline, as a supervisor
    # would, but each one fails the run: a query that keeps failing is a defect to look at).
    max_unexpected_exits: int = 0


@dataclass
class FaultResult:
    kind: str
    at_s: float
    seconds: float
    detail: str = ""
    recovery_s: float | None = None


@dataclass
class Services:
    """What the faults act on: Redis, the broker, and the proxy in front of it (memory mode)."""

    redis: Any
    kafka: Any
    proxy: Any
    bootstrap: str

    @property
    def redis_url(self) -> str:
        return str(self.redis.url)


@dataclass
class Observed:
    faults: list[FaultResult] = field(default_factory=list)
    unexpected_exits: int = 0
    peak_rss: int = 0


def _metric(redis_url: str, app: str, stage: str, name: str) -> int:
    import redis

    from millstream.state.keys import app_key
    from millstream.status import committed_counters

    try:
        client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        try:
            if name == "batches":  # the driver counts batches; the shards commit the rest
                return int(client.hget(app_key(app, "metrics", stage), name) or 0)
            return committed_counters(client, app, stage).get(name, 0)
        finally:
            client.close()
    except redis.RedisError:
        return -1  # Redis is down (a restart fault): no progress can be seen


def _say(message: str) -> None:
    print(f"millstream chaos: {message}", file=sys.stderr, flush=True)


class _RssSampler(threading.Thread):
    def __init__(self, pipeline: PipelineProcess, observed: Observed) -> None:
        super().__init__(name="chaos-rss", daemon=True)
        self.pipeline = pipeline
        self.observed = observed
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(2.0):
            if self.pipeline.alive():
                rss = sum(m.rss_bytes for m in self.pipeline.rss())
                self.observed.peak_rss = max(self.observed.peak_rss, rss)


def run_chaos(opts: ChaosOptions) -> dict[str, Any]:
    from millstream.connectors.topics import ensure_topics
    from millstream.embedded import free_port, start_kafka, start_kafka_durable, start_redis
    from millstream.testing.proxy import TcpProxy

    app = f"chaos-{uuid.uuid4().hex[:8]}"
    folder = (opts.output / app).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    schedule = fault_schedule(opts.seed, opts.duration, opts.faults, opts.every)
    _say(f"app {app}: {opts.duration:.0f}s at {opts.rate:.0f} events/s, {len(schedule)} faults")
    if "restart-broker" in opts.faults and opts.broker != "durable":
        raise ValueError("the restart-broker fault needs broker='durable' (--broker durable)")
    redis_service = start_redis(folder / "redis", appendonly=True)
    proxy = None
    if opts.broker == "durable":
        kafka_service = start_kafka_durable(folder / "kafka")
        bootstrap = kafka_service.bootstrap
    else:
        target = free_port()
        proxy = TcpProxy(free_port(), target).start()
        kafka_service = start_kafka(folder / "kafka", target, advertised_port=proxy.listen_port)
        bootstrap = f"127.0.0.1:{proxy.listen_port}"
    try:
        kafka = {"bootstrap.servers": bootstrap}
        topics = {"input_topic": f"{app}-events", "output_topic": f"{app}-counted"}
        ensure_topics(kafka, {name: PARTITIONS for name in topics.values()})
        config = {
            "app": app,
            "bootstrap": bootstrap,
            "shards": opts.shards,
            **topics,
        }
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        env = {
            **os.environ,
            "REDIS_URL": redis_service.url,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "MILLSTREAM_APP": app,
            "MILLSTREAM_CHECKPOINT_DIR": str(folder / "checkpoints"),
            "MILLSTREAM_TRIGGER_MS": "300",
            "MILLSTREAM_LOG_LEVEL": "WARNING",
            "MILLSTREAM_EMBEDDED": "never",
            # Killed workers and restarted services fail queries, by design; a query that keeps
            # failing after restarts in the same JVM (seen: Spark cannot deserialize its tasks
            # any more, java.io.OptionalDataException) ends the process, and the harness
            # restarts it like a supervisor would (counted as an unexpected exit).
            "MILLSTREAM_QUERY_RESTARTS": "6",
        }
        pipeline = PipelineProcess(
            [sys.executable, "-m", "millstream.chaos.worker", str(folder / "config.json")],
            env,
            folder / "pipeline.log",
        )
        observed = Observed()
        services = Services(redis_service, kafka_service, proxy, bootstrap)
        _drive(opts, app, schedule, pipeline, services, kafka, topics, observed)
        return _verify(opts, app, folder, observed, redis_service.url, bootstrap, topics)
    finally:
        if proxy is not None:
            proxy.close()
        kafka_service.stop()
        redis_service.stop()


def _wait_progress(
    redis_url: str, app: str, pipeline: PipelineProcess, observed: Observed, timeout: float
) -> float | None:
    """Seconds until the last stage commits new records again; restarts a pipeline that exited."""
    start = time.monotonic()
    before = _metric(redis_url, app, "count", "records")
    while time.monotonic() - start < timeout:
        if not pipeline.alive():
            observed.unexpected_exits += 1
            _say(f"the pipeline exited (see {pipeline.log_path}); restarting it")
            pipeline.start()
        now = _metric(redis_url, app, "count", "records")
        if before < 0:
            before = now
        elif now > before:
            return time.monotonic() - start
        time.sleep(0.25)
    return None


def _drive(
    opts: ChaosOptions,
    app: str,
    schedule: list[Fault],
    pipeline: PipelineProcess,
    services: Services,
    kafka: dict[str, str],
    topics: dict[str, str],
    observed: Observed,
) -> None:
    rng = random.Random(opts.seed + 1)
    pipeline.start()
    sampler = _RssSampler(pipeline, observed)
    sampler.start()
    sender = EventSender(kafka, topics["input_topic"], app, opts.rate, opts.keys, opts.seed)
    try:
        deadline = time.monotonic() + 300
        while not all(_metric(services.redis_url, app, s, "batches") > 0 for s in STAGES):
            if not pipeline.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the pipeline did not start; see {pipeline.log_path}")
            time.sleep(0.5)
        _say("pipeline running; traffic starts")
        sender.start()
        started = time.monotonic()
        last_progress = 0.0
        for fault in schedule:
            while time.monotonic() - started < fault.at_s:
                if time.monotonic() - last_progress >= 10:
                    last_progress = time.monotonic()
                    _progress(started, sender, services.redis_url, app, observed)
                time.sleep(0.25)
            result = _inject(fault, pipeline, services, kafka, topics, sender, rng)
            result.recovery_s = _wait_progress(services.redis_url, app, pipeline, observed, 240)
            observed.faults.append(result)
            recovered = (
                "not recovered"
                if result.recovery_s is None
                else f"recovered in {result.recovery_s:.1f}s"
            )
            _say(f"+{time.monotonic() - started:.0f}s {fault.kind} {result.detail}: {recovered}")
        while time.monotonic() - started < opts.duration:
            if time.monotonic() - last_progress >= 10:
                last_progress = time.monotonic()
                _progress(started, sender, services.redis_url, app, observed)
            time.sleep(0.25)
        sender.stop()
        sender.join(320)
        if sender.error is not None:
            raise RuntimeError(f"the event sender failed: {sender.error}")
        _drain(opts, app, pipeline, services.redis_url, services.bootstrap, topics, observed)
    finally:
        sender.stop()
        pipeline.stop()
        sampler.halt.set()


def _progress(
    started: float, sender: EventSender, redis_url: str, app: str, observed: Observed
) -> None:
    counted = _metric(redis_url, app, "count", "records")
    _say(
        f"[{time.monotonic() - started:4.0f}s] sent {sender.sent}, counted {counted}, "
        f"faults {len(observed.faults)}, pipeline RSS {observed.peak_rss / 2**20:.0f} MiB peak"
    )


def _inject(
    fault: Fault,
    pipeline: PipelineProcess,
    services: Services,
    kafka: dict[str, str],
    topics: dict[str, str],
    sender: EventSender,
    rng: random.Random,
) -> FaultResult:
    result = FaultResult(fault.kind, fault.at_s, fault.seconds)
    if fault.kind == "kill-pipeline":
        pipeline.kill9()
        pipeline.start()
    elif fault.kind == "kill-worker":
        victim = kill_python_worker(_session(pipeline), rng)
        result.detail = f"pid {victim}" if victim else "(no Python worker alive: skipped)"
    elif fault.kind == "pause-worker":
        victim = pause_python_worker(_session(pipeline), fault.seconds, rng)
        result.detail = (
            f"pid {victim} for {fault.seconds:.0f}s"
            if victim
            else "(no Python worker alive: skipped)"
        )
        time.sleep(fault.seconds if victim else 0)
    elif fault.kind == "pause-pipeline":
        pipeline.pause()
        time.sleep(fault.seconds)
        pipeline.resume()
        result.detail = f"for {fault.seconds:.0f}s"
    elif fault.kind == "restart-redis":
        restart_service(services.redis)
    elif fault.kind == "restart-broker":
        restart_service(services.kafka)
    elif fault.kind == "broker-outage":
        services.proxy.cut(fault.seconds)
        time.sleep(fault.seconds)
        result.detail = f"every connection cut, refused for {fault.seconds:.0f}s"
    elif fault.kind == "duplicate":
        again = sender.sample_acked(max(20, int(sender.rate * 2)), rng)
        result.detail = f"{duplicate_delivery(kafka, topics['input_topic'], again)} records resent"
    elif fault.kind == "delay":
        sender.hold(fault.seconds)
        time.sleep(fault.seconds)
        result.detail = f"input held {fault.seconds:.0f}s"
    elif fault.kind == "rescale":
        result.detail = _rescale(services.redis_url, pipeline.env["MILLSTREAM_APP"], rng)
    return result


RESCALE_COUNTS = (2, 3, 4, 6, 8, 12, 16)  # splits, merges and moves between unrelated counts


def _rescale(redis_url: str, app: str, rng: random.Random) -> str:
    """Ask for another shard count of `count` (the stage with per-key state and the exactly-once
    output); the running driver moves its keys between two batches."""
    from millstream.state.client import connect
    from millstream.state.shard_count import read_layout, request_rescale

    client = connect(redis_url, cached=False)
    try:
        current = read_layout(client, app, "count")
        before = current.shards if current else None
        shards = rng.choice([n for n in RESCALE_COUNTS if n != before])
        request_rescale(client, app, "count", shards)
    finally:
        client.close()
    return f"count: {before} -> {shards} shards requested"


def _events(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """(id, key) of every record in `topic`, as a read_committed reader sees it."""
    from millstream.testing.committed_reader import read_committed

    out = []
    for record in read_committed(bootstrap, topic):
        body = json.loads(record.value or b"{}")
        out.append((str(body["id"]), str(body["k"])))
    return out


def _session(pipeline: PipelineProcess) -> int:
    if pipeline.pid is None:
        raise RuntimeError("the pipeline is not running")
    return pipeline.pid


def _output_ids(bootstrap: str, topic: str) -> list[str]:
    from millstream.testing.committed_reader import read_committed

    return [json.loads(r.value)["id"] for r in read_committed(bootstrap, topic) if r.value]


def _drain(
    opts: ChaosOptions,
    app: str,
    pipeline: PipelineProcess,
    redis_url: str,
    bootstrap: str,
    topics: dict[str, str],
    observed: Observed,
) -> None:

    expected = {event_id for event_id, _key in _events(bootstrap, topics["input_topic"])}
    _say(f"traffic done: {len(expected)} distinct ids in the input; waiting for all of them")
    deadline = time.monotonic() + opts.drain_timeout
    while time.monotonic() < deadline:
        if not pipeline.alive():
            observed.unexpected_exits += 1
            pipeline.start()
        if expected <= set(_output_ids(bootstrap, topics["output_topic"])):
            time.sleep(3)  # any duplicate still in flight shows up in the final read
            return
        time.sleep(5)
    _say(f"drain timed out after {opts.drain_timeout:.0f}s; verifying what arrived")


def _verify(
    opts: ChaosOptions,
    app: str,
    folder: Path,
    observed: Observed,
    redis_url: str,
    bootstrap: str,
    topics: dict[str, str],
) -> dict[str, Any]:
    import redis

    from millstream.state.shard_count import ShardLayout, pending_rescales, read_layout
    from millstream.testing.committed_reader import (
        fetch_committed,
        judge_plain_view,
        last_stable_offset,
        probe_aborted_leak,
        read_committed,
        read_raw_topic,
        read_with_consumer,
        withheld_by_broker,
    )

    inputs = _events(bootstrap, topics["input_topic"])
    ids_in = [event_id for event_id, _key in inputs]
    key_of = dict(inputs)
    outputs = [
        json.loads(r.value) for r in read_committed(bootstrap, topics["output_topic"]) if r.value
    ]
    report = compare_ids(ids_in, [o["id"] for o in outputs])

    client = redis.Redis.from_url(redis_url)
    state: dict[str, int] = {}
    layout = read_layout(client, app, "count") or ShardLayout(opts.shards)
    for keys in layout.keys(app, "count"):
        for key, raw in client.hgetall(keys.state).items():
            state[key.decode() if isinstance(key, bytes) else key] = json.loads(raw)
    truth = Counter(key_of[i] for i in set(ids_in))
    state_errors = {k: (state.get(k, 0), n) for k, n in truth.items() if state.get(k, 0) != n}
    state_errors.update({k: (v, 0) for k, v in state.items() if k not in truth})
    numbering: dict[str, list[int]] = {}
    for o in outputs:
        numbering.setdefault(o["k"], []).append(int(o["n"]))
    bad_numbering = [k for k, ns in numbering.items() if sorted(ns) != list(range(1, len(ns) + 1))]
    messages = read_with_consumer(bootstrap, topics["output_topic"])
    raw_log = read_raw_topic(bootstrap, topics["output_topic"])
    view = judge_plain_view(
        topics["output_topic"], [(m.partition(), m.offset()) for m in messages], raw_log
    )
    withheld = None
    if view.withheld and not view.unexplained:
        lsos: dict[int, Any] = {}
        for partition in sorted({p for p, _ in view.withheld}):
            try:
                lsos[partition] = last_stable_offset(bootstrap, topics["output_topic"], partition)
            except Exception as exc:  # no answer is no evidence
                lsos[partition] = f"unreadable ({exc})"
        withheld = withheld_by_broker(view, raw_log, lsos)
        if withheld is None:  # what a consumer at the first withheld offset is told
            fetch_lsos: dict[int, Any] = {}
            for partition in sorted({p for p, _ in view.withheld}):
                first = min(o for p, o in view.withheld if p == partition)
                try:
                    answer = fetch_committed(bootstrap, topics["output_topic"], partition, first)
                except Exception:  # no answer is no evidence
                    continue
                if answer is not None and answer.error_code == 0:
                    fetch_lsos[partition] = answer.last_stable_offset
            withheld = withheld_by_broker(
                view, raw_log, fetch_lsos, answered_by="a read_committed Fetch's response"
            )
    plain = plain_consumer_verdict(
        view, probe_aborted_leak(bootstrap) if not view.exact else False, withheld
    )

    recoveries = [f.recovery_s for f in observed.faults if f.recovery_s is not None]
    summary: dict[str, Any] = {
        "app": app,
        "options": {**asdict(opts), "output": str(opts.output)},
        "passed": False,  # set from failed_checks below
        "records_in": len(ids_in),
        "distinct_ids_in": report.expected,
        "duplicates_in": len(ids_in) - report.expected,
        "records_out": report.observed,
        "losses": len(report.missing),
        "duplicates_out": sum(n - 1 for n in report.duplicated.values()),
        "unexpected_out": len(report.unexpected),
        "verdict": report.summary(),
        "state_keys": len(truth),
        "state_mismatches": {
            k: {"state": s, "truth": t} for k, (s, t) in list(state_errors.items())[:10]
        },
        "numbering_errors": bad_numbering[:10],
        "plain_read_committed_consumer_saw": len(messages),
        "plain_read_committed_consumer": plain,
        "faults_by_type": dict(Counter(f.kind for f in observed.faults)),
        "faults": [asdict(f) for f in observed.faults],
        "recovery_s": {
            "median": round(statistics.median(recoveries), 2) if recoveries else None,
            "max": round(max(recoveries), 2) if recoveries else None,
            "not_recovered": len(observed.faults) - len(recoveries),
        },
        "unexpected_pipeline_exits": observed.unexpected_exits,
        # Rescales asked for and not applied by the end (`rescale` faults): none should be.
        "rescales_pending": pending_rescales(client, app),
        "count_layout": layout.encode(),
        "peak_pipeline_rss_mib": round(observed.peak_rss / 2**20),
        "output": str(folder),
        "duplicate_copies": duplicate_copies(raw_log, sorted(report.duplicated)[:5]),
    }
    summary["failed_checks"] = failed_checks(summary, opts.max_unexpected_exits)
    summary["passed"] = not summary["failed_checks"]
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def plain_consumer_verdict(
    view: PlainView, broker_leaks: bool, broker_withholds: str | None = None
) -> dict[str, Any]:
    """What a plain read_committed consumer saw, judged: `exact`, `broker defect` (every extra
    record under an ABORT marker of a fenced producer, on a broker the probe caught serving
    aborted data; withheld committed records only where the broker's own log contradicts the
    last stable offset it answers, `withheld_by_broker`) or `wrong` (anything else)."""
    leaks_ok = not view.leaked or broker_leaks
    withheld_ok = not view.withheld or broker_withholds is not None
    detail = view.summary() + (f"; {broker_withholds}" if broker_withholds else "")
    if view.exact:
        verdict = "exact"
    elif not view.unexplained and leaks_ok and withheld_ok:
        verdict = "broker defect"
    else:
        verdict = "wrong"
    return {"verdict": verdict, "detail": detail}


def failed_checks(summary: dict[str, Any], max_unexpected_exits: int = 0) -> list[str]:
    """Every measured figure that is wrong: the run passes only when this is empty."""
    failed = []
    if summary["losses"] or summary["duplicates_out"] or summary["unexpected_out"]:
        failed.append(f"output not exactly once: {summary['verdict']}")
    if summary["state_mismatches"]:
        failed.append(f"per-key state differs from the truth: {summary['state_mismatches']}")
    if summary["numbering_errors"]:
        failed.append(f"running counts not 1..n for keys {summary['numbering_errors']}")
    if summary.get("rescales_pending"):
        failed.append(f"rescales requested and never applied: {summary['rescales_pending']}")
    if summary["recovery_s"]["not_recovered"]:
        failed.append(f"{summary['recovery_s']['not_recovered']} faults never recovered from")
    plain = summary["plain_read_committed_consumer"]
    if plain["verdict"] == "wrong":
        failed.append(f"a plain read_committed consumer: {plain['detail']}")
    if summary["unexpected_pipeline_exits"] > max_unexpected_exits:
        failed.append(
            f"{summary['unexpected_pipeline_exits']} unexpected pipeline exits "
            f"(at most {max_unexpected_exits} allowed)"
        )
    return failed


def duplicate_copies(partitions: Sequence[list[Any]], ids: list[str]) -> list[str]:
    """Every raw copy of these output ids: partition, offset, producer id and epoch, and the
    marker that closed it. Tells a broker that never ended a fenced epoch's transaction (its
    records closed by the next epoch's COMMIT) from a sink that committed twice."""
    from millstream.testing.committed_reader import record_origins

    wanted = set(ids)
    out: list[str] = []
    for partition, batches in enumerate(partitions):
        for origin in record_origins(partition, batches).values():
            try:
                output_id = json.loads(origin.value)["id"]
            except (ValueError, KeyError, TypeError):
                continue
            if output_id in wanted:
                out.append(
                    f"{output_id} p{partition}@{origin.offset} pid {origin.producer_id} epoch "
                    f"{origin.producer_epoch} {origin.marker or 'no marker'}"
                )
    return sorted(out)


def text_report(summary: dict[str, Any]) -> str:
    rec = summary["recovery_s"]
    lines = [
        f"millstream chaos {summary['app']}: {'PASSED' if summary['passed'] else 'FAILED'}",
        f"  records in {summary['records_in']} ({summary['distinct_ids_in']} distinct ids, "
        f"{summary['duplicates_in']} resent), records out {summary['records_out']}",
        f"  losses {summary['losses']}, duplicates {summary['duplicates_out']}, "
        f"unexpected {summary['unexpected_out']}; per-key state mismatches "
        f"{len(summary['state_mismatches'])} of {summary['state_keys']} keys; "
        f"numbering errors {len(summary['numbering_errors'])}",
        f"  {summary['verdict']}",
        "  faults: " + ", ".join(f"{k} x{n}" for k, n in sorted(summary["faults_by_type"].items())),
        f"  recovery after a fault: median {rec['median']}s, max {rec['max']}s, "
        f"not recovered {rec['not_recovered']}; unexpected pipeline exits "
        f"{summary['unexpected_pipeline_exits']}",
        f"  peak pipeline RSS {summary['peak_pipeline_rss_mib']} MiB; a plain read_committed "
        f"consumer saw {summary['plain_read_committed_consumer_saw']} records: "
        f"{summary['plain_read_committed_consumer']['verdict']} "
        f"({summary['plain_read_committed_consumer']['detail']})",
        *(f"  FAILED: {reason}" for reason in summary["failed_checks"]),
        *(f"  raw copy of a duplicate: {c}" for c in summary.get("duplicate_copies", [])),
        f"  details: {summary['output']}/summary.json",
    ]
    return "\n".join(lines)
