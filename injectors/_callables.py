"""Importing user code named by an option, "package.module:function", on driver and executors."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from millstream.errors import ConfigurationError


def load_callable(path: str, option: str) -> Callable[..., Any]:
    """Import `path`; errors name the option, the cause and the fix.

    Called on the driver to validate the option, and again in each executor process.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(
            f"option {option}={path!r} is invalid: expected 'module:function', "
            "e.g. 'myapp.extract:event_time'."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"option {option}={path!r}: cannot import {module_name!r} ({exc}); install the module "
            "in the environment of the driver and of every executor."
        ) from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise ConfigurationError(
            f"option {option}={path!r}: {module_name!r} has no callable {attr!r}."
        )
    return target  # type: ignore[no-any-return]
