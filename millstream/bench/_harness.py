"""What every scenario uses: the run's context, pipeline processes, memory sampling, readers.

A pipeline under test always runs as a subprocess in its own session (Spark driver, JVM and
Python workers, or a Quix Streams app), so that its memory can be summed over its process tree
and all of it stopped by process group, as the demo does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from millstream.bench._workload import PARTITIONS
from millstream.state.keys import app_key

QUIX_VERSION = "3.28.1"
PROGRESS_FILE = "progress.jsonl"  # a pipeline worker's Spark trigger reports, in its state dir
DRIVER_READ_CHOICES = ("on", "off", "ab")


@dataclass
class Bench:
    """One `millstream bench` run: where things are and how big to make them."""

    output: Path
    workdir: Path
    redis_url: str
    bootstrap: str
    quick: bool
    events: int
    rates: list[float]
    rate_seconds: float
    steady_seconds: float = 600.0
    steady_rate: float = 200.0
    results: dict[str, Any] = field(default_factory=dict)
    warmup: tuple[str, int] | None = None  # (topic, events) every millstream series counts first
    # MILLSTREAM_DRIVER_READ of the pipelines: "on", "off", or "ab" (the latency, watermarks
    # and throughput scenarios run their millstream pipelines with it off, then on).
    driver_read: str = "on"

    def __post_init__(self) -> None:
        if self.driver_read not in DRIVER_READ_CHOICES:
            raise ValueError(f"driver_read must be one of {DRIVER_READ_CHOICES}")

    def read_modes(self) -> list[str]:
        """The MILLSTREAM_DRIVER_READ values a scenario's millstream pipeline runs with, in
        order: off then on for "ab", else the one chosen. The last is the one judged."""
        return ["off", "on"] if self.driver_read == "ab" else [self.driver_read]

    @property
    def main_read(self) -> str:
        """The MILLSTREAM_DRIVER_READ of the figures targets.json judges (on, unless off)."""
        return self.read_modes()[-1]

    @property
    def kafka(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def redis(self) -> Any:
        from millstream.state.client import connect

        return connect(self.redis_url)

    def run_dir(self, name: str) -> Path:
        folder = self.workdir / f"{name}-{uuid.uuid4().hex[:6]}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def pipeline_env(
        self,
        app: str,
        folder: Path,
        *,
        master: str = "local[2]",
        max_batch: int = 200_000,
        idle_slack_ms: int | None = None,
        driver_read: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Environment of a millstream (or plain Spark) pipeline process.

        Every MILLSTREAM_* variable of this process is dropped (but MILLSTREAM_KAFKA_*): what a
        pipeline runs with is only what is set here. `idle_slack_ms`, when given, is
        MILLSTREAM_IDLE_SLACK_MS (else the default). MILLSTREAM_DRIVER_READ is `driver_read`
        ("on" or "off") when given, else the run's `main_read` (--driver-read; "on" for "ab").
        There is one runtime (fused queries), so nothing chooses it.
        """
        read = driver_read or self.main_read
        if read not in ("on", "off"):
            raise ValueError(f"driver_read must be on or off, not {read!r}")
        env = {
            k: v
            for k, v in os.environ.items()
            if (not k.startswith("MILLSTREAM_") or k.startswith("MILLSTREAM_KAFKA_"))
            # a millstream pipeline chooses its Python workers' interpreter as for a user
            # (connectors/python_workers.py); plain Spark's names this one (`plain_pipeline`)
            and k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
        }
        env.update(
            {
                "REDIS_URL": self.redis_url,
                "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                "MILLSTREAM_APP": app,
                "MILLSTREAM_EMBEDDED": "never",
                "MILLSTREAM_STATE_DIR": str(folder),
                "MILLSTREAM_CHECKPOINT_DIR": str(folder / "checkpoints"),
                "MILLSTREAM_SPARK_MASTER": master,
                "MILLSTREAM_TRIGGER_MS": "200",
                "MILLSTREAM_MAX_RECORDS_PER_BATCH": str(max_batch),
                "MILLSTREAM_LOG_LEVEL": "WARNING",
                "MILLSTREAM_DRIVER_READ": read,
                # A loaded machine makes Spark's Python workers miss their connect-back
                # timeout now and then; the query restarts from its checkpoint (counted in
                # each result as `query_restarts`) instead of ending the run.
                "MILLSTREAM_QUERY_RESTARTS": "20",
                "SPARK_LOCAL_IP": "127.0.0.1",
            }
        )
        if idle_slack_ms is not None:
            env["MILLSTREAM_IDLE_SLACK_MS"] = str(idle_slack_ms)
        env.update(extra or {})  # a scenario's own (a standalone cluster's SPARK_CONF_DIR)
        return env


# ---------------------------------------------------------------- processes and memory


def tree_rss_by_kind(root: int) -> dict[str, int]:
    """Resident bytes of `root`'s session and every descendant, by kind: java, python, other."""
    out = {"java": 0, "python": 0, "other": 0}
    for kind, _, rss in tree_rss_by_process(root):
        out[kind] += rss
    return out


def tree_rss_by_process(root: int) -> list[tuple[str, int, int]]:
    """(kind, pid, resident bytes) of each process of `root`'s session and its descendants,
    largest first; kind is java, python or other."""
    info, _ = _proc_table()
    members = {pid for pid in _tree(info, root) if info[pid][2] > 0}  # zombies hold none
    return sorted(_counted(info, members), key=lambda item: -item[2])


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user and system) spent so far by `root`'s session and its descendants,
    the children they have reaped included: a Spark Python worker that exits between two
    samples moves its time into its parent's, so a difference of two samples loses none."""
    info, ticks = _proc_table()
    return sum(ticks[pid] for pid in _tree(info, root)) / os.sysconf("SC_CLK_TCK")


def _proc_table() -> tuple[dict[int, tuple[int, int, int, str]], dict[int, int]]:
    """Every live process: pid -> (ppid, session, rss bytes, comm), and pid -> CPU clock ticks
    (utime + stime + cutime + cstime)."""
    page = os.sysconf("SC_PAGE_SIZE")
    info: dict[int, tuple[int, int, int, str]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()  # fields[0] is the stat file's third field
        # A zombie holds no memory, but its CPU until its parent reaps it (then the parent's).
        rss = 0 if fields[0] == "Z" else int(fields[21]) * page
        info[int(entry)] = (int(fields[1]), int(fields[3]), rss, comm)
        ticks[int(entry)] = sum(int(f) for f in fields[11:15])
    return info, ticks


def _tree(info: dict[int, tuple[int, int, int, str]], root: int) -> set[int]:
    """`root`, the members of its session and every descendant of them, among live processes."""
    members = {pid for pid, (_, sid, _, _) in info.items() if sid == root} | {root}
    grew = True
    while grew:
        extra = {pid for pid, (ppid, _, _, _) in info.items() if ppid in members} - members
        members |= extra
        grew = bool(extra)
    return members & info.keys()


def _counted(
    info: dict[int, tuple[int, int, int, str]], members: set[int]
) -> list[tuple[str, int, int]]:
    """(kind, pid, rss) of the members that hold memory of their own. A JVM's child caught
    between fork and exec (it launches Python workers so) shows the JVM's whole RSS, pages it
    shares copy-on-write with the JVM: counted, it doubled the JVM's share of a sample
    (a 558 MB "other" beside a 558 MB JVM). Such a child, not Python, at 90% or more of its
    parent's RSS, is left out."""
    out: list[tuple[str, int, int]] = []
    for pid in members:
        ppid, _, rss, comm = info[pid]
        kind = "java" if comm == "java" else "python" if comm.startswith("python") else "other"
        parent = info[ppid] if ppid in members else None
        if (
            kind != "python"
            and parent is not None
            and parent[3] == "java"
            and rss >= 0.9 * parent[2]
        ):
            continue
        out.append((kind, pid, rss))
    return out


def tree_rss_bytes(root: int) -> int:
    """Resident memory summed over `root`'s session and every descendant of `root`."""
    return sum(tree_rss_by_kind(root).values())


class RssSampler(threading.Thread):
    """Peak of `tree_rss_bytes(pid)`, sampled twice a second, and what it was made of: each
    process of the tree at that moment (`peak_by_process`: driver, JVM, Python workers)."""

    def __init__(self, pid: int) -> None:
        super().__init__(name=f"rss-{pid}", daemon=True)
        self.pid = pid
        self.peak = 0
        self.peak_by_process: list[tuple[str, int, int]] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(Exception):
                processes = tree_rss_by_process(self.pid)
                total = sum(rss for _, _, rss in processes)
                if total > self.peak:
                    self.peak, self.peak_by_process = total, processes
            self._halt.wait(0.5)


class Process:
    """A pipeline subprocess in its own session, its log in a file, its memory sampled."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.sampler: RssSampler | None = None
        self.started = 0.0

    def __enter__(self) -> Process:
        log = self.log_path.open("ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.sampler = RssSampler(self.proc.pid)
        self.sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def peak_rss_mb(self) -> float:
        return round((self.sampler.peak if self.sampler else 0) / 2**20, 1)

    @property
    def peak_rss_by_process_mb(self) -> dict[str, float]:
        """What the peak was made of: MB per process of the tree, largest first, each named by
        kind and pid ("java 123", "python 456 (driver)" for the pipeline's own process)."""
        found = self.sampler.peak_by_process if self.sampler else []
        driver = self.proc.pid if self.proc else None
        return {
            f"{kind} {pid}{' (driver)' if pid == driver else ''}": round(rss / 2**20, 1)
            for kind, pid, rss in found
        }

    def cpu_seconds(self) -> float:
        """CPU seconds the pipeline's process tree has spent so far (`tree_cpu_seconds`)."""
        return tree_cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    @property
    def restarts(self) -> int:
        """Query restarts the pipeline logged (`failed (restart n of m)`)."""
        try:
            return self.log_path.read_text(errors="replace").count("failed (restart")
        except OSError:
            return 0

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # The process itself first: a pipeline's driver stops its queries while its JVM
            # and stream runners live (a SIGTERM of the group reset the runners' sockets under
            # a running trigger, and the log read "terminated with error").
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the JVM may outlive the driver

    def wait_for(self, what: str, condition: Callable[[], bool], timeout: float) -> float:
        """Poll `condition` every 0.1 s; returns the monotonic time it became true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return time.monotonic()
            if not self.alive():
                raise RuntimeError(
                    f"{self.argv[-1]} exited while waiting for {what}; log {self.log_path}:\n"
                    + self.tail()
                )
            time.sleep(0.1)
        raise TimeoutError(
            f"timed out after {timeout:.0f}s waiting for {what}; log {self.log_path}:\n"
            + self.tail()
        )


def millstream_pipeline(bench: Bench, config: dict[str, Any], folder: Path, **env: Any) -> Process:
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return Process(
        [sys.executable, "-m", "millstream.bench._worker", str(path)],
        bench.pipeline_env(str(config["app"]), folder, **env),
        folder / "pipeline.log",
    )


def metric(client: Any, app: str, computation: str, name: str) -> int:
    return int(client.hget(app_key(app, "metrics", computation), name) or 0)


class BatchProfile(threading.Thread):
    """Where a pipeline's batches spend their time, from what the runtime leaves in Redis.

    Polls each computation's `last_batch` (`seconds`) and the application's `fused` hash (the
    fused query's batch: its `rows` and `phases`: read, one per computation, deliver_ack) four
    times a second, keeping each batch once (by batch id) with when it was first seen
    (`seen_ms`, wall clock). A batch shorter than the poll interval may be missed; the summary
    says how many were seen.
    """

    def __init__(
        self, client: Any, app: str, computations: Sequence[str], interval: float = 0.25
    ) -> None:
        super().__init__(name=f"profile-{app}", daemon=True)
        self.client = client
        self.app = app
        self.computations = list(computations)
        self.interval = interval
        self.batches: dict[str, dict[int, dict[str, Any]]] = {}
        self.started = 0.0
        self.stopped = 0.0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.stopped = time.monotonic()

    def _keys(self) -> list[tuple[str, str]]:
        return [(c, app_key(self.app, "metrics", c)) for c in self.computations] + [
            ("#fused", app_key(self.app, "fused"))
        ]

    def run(self) -> None:
        self.started = time.monotonic()
        keys = self._keys()
        while not self._halt.is_set():
            with contextlib.suppress(Exception):
                pipe = self.client.pipeline(transaction=False)
                for _, key in keys:
                    pipe.hget(key, "last_batch")
                for (name, _), raw in zip(keys, pipe.execute(), strict=True):
                    if not raw:
                        continue
                    batch = json.loads(raw)
                    if "batch_id" in batch:
                        seen = self.batches.setdefault(name, {})
                        first = seen.get(int(batch["batch_id"]), {}).get("seen_ms")
                        batch["seen_ms"] = first or int(time.time() * 1000)
                        seen[int(batch["batch_id"])] = batch
            self._halt.wait(self.interval)

    def summary(self) -> dict[str, Any]:
        return profile_summary(self.batches, (self.stopped or time.monotonic()) - self.started)


def spark_progress(path: Path, prefix: str, since_ms: int = 0) -> dict[str, Any]:
    """Spark's per-trigger report (the pipeline worker's `progress.jsonl`) for the queries named
    `prefix`*, from `since_ms` (wall clock) on: per query, triggers seen, the gap between
    consecutive trigger starts, input rows, and each durationMs phase as p50 / p95 / max, in
    seconds. `addBatch` is the runtime's foreachBatch; `triggerExecution` the whole trigger."""
    from datetime import datetime

    by_query: dict[str, list[dict[str, Any]]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            item = json.loads(line)
            started = datetime.fromisoformat(str(item["timestamp"]).replace("Z", "+00:00"))
        except (ValueError, KeyError):
            continue
        item["at_ms"] = int(started.timestamp() * 1000)
        if str(item.get("query") or "").startswith(prefix) and item["at_ms"] >= since_ms:
            by_query.setdefault(str(item["query"]), []).append(item)
    out: dict[str, Any] = {}
    for query, items in sorted(by_query.items()):
        items.sort(key=lambda i: i["at_ms"])
        starts = [i["at_ms"] for i in items]

        def durations(chosen: list[dict[str, Any]]) -> dict[str, Any]:
            phases: dict[str, list[float]] = {}
            for i in chosen:
                for phase, ms in (i.get("duration_ms") or {}).items():
                    phases.setdefault(phase, []).append(float(ms) / 1000)
            return {phase: _spread(v) for phase, v in sorted(phases.items())}

        with_rows = [i for i in items if i.get("rows")]
        out[query] = {
            "triggers": len(items),
            "with_rows": len(with_rows),
            "gap_s": _spread([(b - a) / 1000 for a, b in itertools.pairwise(starts)]),
            "rows": _spread([float(i.get("rows") or 0) for i in items]),
            "duration_s": durations(items),
            "duration_s_with_rows": durations(with_rows),
        }
    return out


def trigger_line(spark: dict[str, Any]) -> str:
    """Per Spark query: triggers, the p50 gap between trigger starts, and the p50 of the
    trigger's phases that matter here (seconds)."""
    parts = []
    for query, found in spark.items():
        d = found["duration_s"]
        phases = ", ".join(
            f"{k} {d[k]['p50']}"
            for k in ("triggerExecution", "latestOffset", "addBatch", "walCommit", "commitOffsets")
            if k in d
        )
        busy = found.get("duration_s_with_rows", {})
        parts.append(
            f"{query.split('.', 1)[-1]} {found['triggers']} triggers, gap p50 "
            f"{found['gap_s']['p50']} ({phases}); {found.get('with_rows')} with rows: "
            f"triggerExecution p50 {busy.get('triggerExecution', {}).get('p50')}, addBatch "
            f"{busy.get('addBatch', {}).get('p50')}"
        )
    return "Spark triggers p50 s: " + ("; ".join(parts) or "none recorded")


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    stats = percentiles(values)
    return {"p50": stats["p50"], "p95": stats["p95"], "max": stats["max"]}


def profile_summary(
    batches: dict[str, dict[int, dict[str, Any]]], seconds: float
) -> dict[str, Any]:
    """Per computation (and `#fused`, the fused query's own figures): batches seen, batch
    seconds and each phase's seconds as p50 / p95 / max over the batches seen, and the same
    over only the batches that took input (`with_input`)."""

    def spreads(items: list[dict[str, Any]]) -> dict[str, Any]:
        entry: dict[str, Any] = {"batches": len(items)}
        durations = [float(b["seconds"]) for b in items if "seconds" in b]
        if durations:
            entry["seconds"] = _spread(durations)
        if any("rows" in b for b in items):
            entry["rows"] = _spread([float(b.get("rows", 0)) for b in items])
        if any("records" in b for b in items):
            entry["records"] = _spread([float(b.get("records", 0)) for b in items])
        phases: dict[str, list[float]] = {}
        for b in items:
            for phase, value in (b.get("phases") or {}).items():
                if isinstance(value, int | float):
                    phases.setdefault(phase, []).append(float(value))
        if phases:
            entry["phases"] = {phase: _spread(v) for phase, v in phases.items()}
        return entry

    out: dict[str, Any] = {}
    for name, seen in sorted(batches.items()):
        items = list(seen.values())
        entry: dict[str, Any] = {
            "batches_seen": len(items),
            "batch_ids": [min(seen), max(seen)] if seen else None,
            "observed_s": round(seconds, 1),
            **{k: v for k, v in spreads(items).items() if k != "batches"},
        }
        # Batches that took input (fused: rows read; per computation: records) apart from
        # the empty ones a caught-up pipeline runs between them.
        busy = [b for b in items if (b.get("rows") or b.get("records") or 0) > 0]
        if busy and len(busy) < len(items):
            entry["with_input"] = spreads(busy)
        out[name] = entry
    return out


# ---------------------------------------------------------------- Quix Streams


def quix_python(bench: Bench) -> Path:
    """The Quix virtualenv's python, created (`python -m venv` + pip) on first use."""
    venv = Path(".millstream/bench/quix-venv").resolve()
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import quixstreams; print(quixstreams.__version__)"]
    if python.exists():
        found = subprocess.run(probe, capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip() == QUIX_VERSION:
            return python
    print(f"bench: installing quixstreams=={QUIX_VERSION} into {venv}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}"], check=True
    )
    return python


def quix_pipeline(
    bench: Bench, folder: Path, input_topic: str, output_topic: str, commit_interval: float
) -> tuple[Process, Path]:
    """The Quix app process and the file where it reports how many messages it processed."""
    progress = folder / "progress.json"
    config = {
        "bootstrap": bench.bootstrap,
        "input_topic": input_topic,
        "output_topic": output_topic,
        "group": f"quix-{folder.name}",
        "state_dir": str(folder / "state"),
        "commit_interval": commit_interval,
        "progress_file": str(progress),
    }
    path = folder / "quix.json"
    path.write_text(json.dumps(config, indent=2))
    script = Path(__file__).with_name("quix_app.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    process = Process([str(quix_python(bench)), str(script), str(path)], env, folder / "quix.log")
    return process, progress


def quix_processed(progress: Path) -> int:
    try:
        return int(json.loads(progress.read_text())["processed"])
    except (OSError, ValueError, KeyError):
        return 0


def committed_offsets(bootstrap: str, group: str, topic: str) -> int:
    """Sum over partitions of `group`'s committed offsets on `topic`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 10)
        return sum(max(0, tp.offset) for tp in parts)
    finally:
        consumer.close()


# ---------------------------------------------------------------- output check


def committed_count(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees, computed by the marker-aware reader."""
    from millstream.testing.committed_reader import read_committed

    return len(read_committed(bootstrap, topic, timeout=30))


# ---------------------------------------------------------------- reporting


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

    return {
        "n": len(ordered),
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1], 4),
    }


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for raw, row in zip(rows, cells, strict=True):
        lines.append(
            "  ".join(
                c.ljust(w) if isinstance(v, str) else c.rjust(w)
                for v, c, w in zip(raw, row, widths, strict=True)
            ).rstrip()
        )
    text = "\n".join(lines)
    print(text + "\n", flush=True)
    return text


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def plain_pipeline(
    bench: Bench,
    folder: Path,
    mode: str,
    input_topic: str,
    warmup_topic: str | None = None,
    **env: Any,
) -> tuple[Process, str]:
    """A plain Spark baseline process (`plain_spark.py`) and its Redis key prefix."""
    prefix = f"plain:{folder.name}"
    config = {
        "mode": mode,
        "bootstrap": bench.bootstrap,
        "redis_url": bench.redis_url,
        "input_topic": input_topic,
        "prefix": prefix,
        "checkpoint": str(folder / "checkpoint"),
        "latency_file": str(folder / "latency.txt"),
        "warmup_topic": warmup_topic,
    }
    path = folder / "plain.json"
    path.write_text(json.dumps(config, indent=2))
    process = Process(
        [sys.executable, "-m", "millstream.bench.plain_spark", str(path)],
        {
            **bench.pipeline_env(f"plain-{folder.name}", folder, **env),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        },
        folder / "plain.log",
    )
    return process, prefix


def redis_int(client: Any, key: str) -> int:
    return int(client.get(key) or 0)
