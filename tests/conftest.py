"""Shared fixtures: real Redis, Kafka and Spark (see millstream.testing.fixtures)."""

pytest_plugins = ["millstream.testing.fixtures"]
