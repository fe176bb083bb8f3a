"""The secrets tests use, all carrying one marker that `scripts/grep_secrets.sh` hunts for.

Every password, token or key a test hands to millstream contains `MARKER`, so a secret that
leaks into any log, error message or file the test run leaves behind is found by grepping for
one string (`.ci/run` does that after the suite). Use `secret("what")` for a fresh one.
"""

from __future__ import annotations

import secrets

MARKER = "s3cr3t-ms-7f2a"

REDIS_PASSWORD = f"{MARKER}-redis"
KAFKA_SASL_PASSWORD = f"{MARKER}-sasl"


def secret(label: str) -> str:
    """A fresh secret for one test (unique, so tests never share credentials) with the marker."""
    return f"{MARKER}-{label}-{secrets.token_hex(6)}"
