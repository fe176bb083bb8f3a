"""Test support for millstream users: real infrastructure, started or found for you.

In a `conftest.py`: `pytest_plugins = ["millstream.testing.fixtures"]`. Outside pytest, use
`millstream.testing.infra` (or `millstream.embedded`) directly.
"""

from millstream.testing.infra import (
    InfraPlan,
    KafkaHandle,
    RedisClusterHandle,
    RedisHandle,
    acquire_kafka,
    acquire_redis,
    create_topic,
    delete_topics,
    plan_infra,
    spark_session_for_tests,
    start_redis_cluster,
    stop_spark_session,
)

__all__ = [
    "InfraPlan",
    "KafkaHandle",
    "RedisClusterHandle",
    "RedisHandle",
    "acquire_kafka",
    "acquire_redis",
    "create_topic",
    "delete_topics",
    "plan_infra",
    "spark_session_for_tests",
    "start_redis_cluster",
    "stop_spark_session",
]
