"""A pipeline as a child process in its own session, for fault tests: start, SIGKILL, restart.

`millstream run` starts a driver, which starts a JVM, which forks Spark's Python daemon and its
workers. The daemon moves itself into a process group of its own, so killing the driver's group
leaves it behind; `kill9()` kills every process of the session instead, as a machine crash
would. `rss()` samples each member's resident memory from /proc.

    pipeline = PipelineProcess.run_target("mypkg.pipeline:topology", env, log_path)
    pipeline.start()
    ...
    pipeline.kill9()
    pipeline.start()  # same Spark checkpoints, same Redis state
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from millstream.testing._crash import kill_session, session_members, with_crash_hook

__all__ = ["MemberMemory", "PipelineProcess"]


@dataclass(frozen=True, slots=True)
class MemberMemory:
    """One process of the pipeline: its pid, what it runs and its resident set size."""

    pid: int
    kind: str  # "java" or "python" (driver, Spark's Python daemon and workers)
    rss_bytes: int


def _timeline(what: str, seconds: float) -> None:
    """With MILLSTREAM_TEST_TIMELINE set to a file, each wait is appended to it as a line of
    JSON: where a long test spends its time."""
    path = os.environ.get("MILLSTREAM_TEST_TIMELINE")
    if path:
        import json

        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        with open(path, "a") as out:
            out.write(
                json.dumps(
                    {
                        "test": test,
                        "at": round(time.time(), 2),
                        "what": what,
                        "s": round(seconds, 2),
                    }
                )
                + "\n"
            )


class PipelineProcess:
    """One pipeline run as `argv` in a new session, its output appended to `log_path`."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def run_target(
        cls,
        target: str,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | str | None = None,
    ) -> PipelineProcess:
        """`millstream run module:attribute` with this interpreter."""
        return cls([sys.executable, "-m", "millstream.cli", "run", target], env, log_path, cwd)

    # ------------------------------------------------------------------------------ lifecycle
    def start(self, env: Mapping[str, str] | None = None) -> None:
        """Start (again); `env` replaces the environment given at construction for this run.

        An environment that asks for a crash point (MILLSTREAM_TEST_CRASH_AT) also gets the fault
        hook that makes every process of the pipeline honour it.
        """
        if self.alive():
            raise RuntimeError(f"the pipeline (pid {self.pid}) is still running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _timeline("start", 0.0)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=with_crash_hook(env if env is not None else self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def members(self) -> list[int]:
        """PIDs of every live process of the pipeline's session (the driver included)."""
        if self.proc is None:
            return []
        return session_members(self.proc.pid)

    def kill9(self) -> None:
        """SIGKILL every process of the session at once, then reap the driver."""
        if self.proc is None:
            return
        kill_session(self.proc.pid)
        self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP every process of the session: a long GC pause, or a machine that froze."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT every process of the session: the paused pipeline wakes up as a zombie."""
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        for pid in session_members(self.proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def wait_exit(self, timeout: float) -> int:
        """The driver's exit code (negative: killed by that signal); raises if it keeps running."""
        assert self.proc is not None
        began = time.monotonic()
        code = self.proc.wait(timeout)
        _timeline("exit", time.monotonic() - began)
        self._sweep()
        return code

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (a clean stop after the current batches), SIGKILL after `timeout`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_session(self.proc.pid)
                self.proc.wait()
        self._sweep()
        return self.proc.returncode

    def _sweep(self) -> None:
        """Kill what outlived the driver (a JVM, Spark's Python daemon)."""
        assert self.proc is not None
        deadline = time.monotonic() + 5
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.members():
            kill_session(self.proc.pid)

    # ------------------------------------------------------------------------------ observing
    def rss(self) -> list[MemberMemory]:
        """Resident memory of every member, from /proc/<pid>/status (VmRSS)."""
        out = []
        for pid in self.members():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            rss = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), None)
            if rss is None:
                continue
            exe = cmdline.split(b"\0", 1)[0].decode(errors="replace")
            kind = "java" if Path(exe).name == "java" else "python"
            out.append(MemberMemory(pid, kind, int(rss.split()[1]) * 1024))
        return out

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def wait_for(
        self, condition: Callable[[], bool], timeout: float, what: str, *, may_exit: bool = False
    ) -> None:
        """Poll `condition` every 0.25 s; fail with the log tail on timeout or an early exit."""
        began = time.monotonic()
        deadline = began + timeout
        while time.monotonic() < deadline:
            if condition():
                _timeline(what, time.monotonic() - began)
                return
            if not may_exit and not self.alive():
                raise AssertionError(
                    f"the pipeline exited ({self.returncode()}) while waiting for {what}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.25)
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what}:\n{self.log_tail()}"
        )

    def __enter__(self) -> PipelineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.kill9() if self.alive() else self._sweep()
