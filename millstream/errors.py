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
    bounded number of times; then the task fails and Spark retries it. A task of a batch older
    than the shard's last committed one does not start over: StaleBatchError.
    """


class StaleBatchError(FencedError):
    """A shard task of an older micro-batch was fenced, and the shard has since committed a
    newer batch: the task is a zombie of a batch that is over. It stops instead of acquiring
    the shard again, which would fence the current owner."""


class TransientError(MillstreamError):
    """Redis or Kafka was unavailable or slow: retrying later is right."""


class PoisonRecordError(MillstreamError):
    """A record that cannot be processed: it goes to the dead-letter stream."""


class TimestampContractError(MillstreamError):
    """User code broke MillWheel's timestamp contract (section 4.5): a production stamped
    earlier than its cause, or a watermark hold the low watermark has already passed. Such
    output would be late, and dropped, downstream; it is a user error (retried, then dead-
    lettered with this message, or fail-stop)."""


class DependencyMissingError(ConfigurationError):
    """An optional dependency or system program is missing; the message says how to install it."""
