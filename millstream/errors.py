"""The error hierarchy: one root, leaves named for what the caller must do."""

from __future__ import annotations


class MillstreamError(Exception):
    """Root of every error millstream raises on purpose."""


class ConfigurationError(MillstreamError):
    """Bad settings or topology: fix the configuration and start again."""


class FencedError(MillstreamError):
    """The shard's lease moved to a newer owner: this writer's commit was discarded whole.

    A commit is never retried with the old lease. The shard task starts over from acquire with
    a fresh lease (its input may belong to a batch the newer owner is not processing), a
    bounded number of times; then the task fails and Spark retries it.
    """


class TransientError(MillstreamError):
    """Redis or Kafka was unavailable or slow: retrying later is right."""


class PoisonRecordError(MillstreamError):
    """A record that cannot be processed: it goes to the dead-letter stream."""


class DependencyMissingError(ConfigurationError):
    """An optional dependency or system program is missing; the message says how to install it."""
