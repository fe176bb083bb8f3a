"""Test support for millstream users: real infrastructure, real faults, verification by id.

In a `conftest.py`: `pytest_plugins = ["millstream.testing.fixtures"]`. Outside pytest, use
`millstream.testing.infra` (or `millstream.embedded`) directly. Fault injectors are in
`millstream.testing.faults`, the id verifier in `millstream.testing.verify`.

`TopologyTestDriver` runs a topology in memory for unit tests. Importing this package needs
only millstream's own dependencies (no pytest, testcontainers, Java or services): keep its
module-level imports that way; `fixtures` (pytest) is loaded only as a pytest plugin.
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
from millstream.testing.process import PipelineProcess
from millstream.testing.proxy import TcpProxy
from millstream.testing.topology_driver import TopologyTestDriver
from millstream.testing.verify import IdReport, compare_ids

__all__ = [
    "IdReport",
    "InfraPlan",
    "KafkaHandle",
    "PipelineProcess",
    "RedisClusterHandle",
    "RedisHandle",
    "TcpProxy",
    "TopologyTestDriver",
    "acquire_kafka",
    "acquire_redis",
    "compare_ids",
    "create_topic",
    "delete_topics",
    "plan_infra",
    "spark_session_for_tests",
    "start_redis_cluster",
    "stop_spark_session",
]
