"""Named steps of the delivery protocol where tests inject faults; no-ops unless a hook is set.

The runtime calls `fault_point(name)` at the steps whose crash recovery must be proven (after
the Redis commit, before and after the Kafka commit). Hooks come from outside the product, so
product code never imports test code:

- `install_fault_hook(fn)` in this process (a test that runs the runtime in-process);
- `MILLSTREAM_TEST_FAULT_HOOK=module:function` in the environment, imported at the first fault
  point of each process. A pipeline's processes inherit its environment, so this reaches the
  ones no test code runs in first: the driver of `millstream run` and Spark's Python workers.
  The test harness names `millstream.testing._crash:crash_point` there whenever a test asks
  for a crash (`MILLSTREAM_TEST_CRASH_AT`, see `millstream.testing.process`).

Read from the environment here rather than through `Settings`: like the other `MILLSTREAM_TEST_*`
variables it is a test-suite knob, never set in production.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable

from millstream.errors import ConfigurationError

ENV_HOOK = "MILLSTREAM_TEST_FAULT_HOOK"

FaultHook = Callable[[str], None]

_hooks: list[FaultHook] = []
_lock = threading.Lock()
_env_read: list[bool] = []  # [True] once this process has loaded the environment's hook


def fault_point(name: str) -> None:
    """Mark the protocol step `name`: call every installed hook (one may kill the process)."""
    if not _env_read:
        _load_env_hook()
    for hook in tuple(_hooks):
        hook(name)


def install_fault_hook(hook: FaultHook) -> None:
    """Call `hook(name)` at every fault point of this process, after those installed before."""
    with _lock:
        _hooks.append(hook)


def remove_fault_hook(hook: FaultHook) -> None:
    """Stop calling `hook`; a hook that is not installed is ignored."""
    with _lock:
        if hook in _hooks:
            _hooks.remove(hook)


def load_hook(spec: str) -> FaultHook:
    """Import the function a "module:function" spec names; ConfigurationError if it cannot."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"{ENV_HOOK}={spec!r} is invalid: expected module:function, "
            "for example millstream.testing._crash:crash_point"
        )
    try:
        hook = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"{ENV_HOOK}={spec!r}: cannot load it ({exc}): name an importable module and function"
        ) from None
    if not callable(hook):
        raise ConfigurationError(f"{ENV_HOOK}={spec!r} names {hook!r}, which is not callable")
    return hook  # type: ignore[no-any-return]


def _load_env_hook() -> None:
    """Install the environment's hook once per process (Spark forks workers: each reads it)."""
    with _lock:
        if _env_read:
            return
        spec = os.environ.get(ENV_HOOK, "").strip()
        if spec:
            _hooks.insert(0, load_hook(spec))  # raises (and is retried) while the spec is bad
        _env_read.append(True)
