"""The row every injector emits: one contract between injectors and the computation runtime."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

# id: stable across redeliveries. timestamp: event time ms (null only on error rows).
# system_time: stable ms used for dedup buckets and catalog GC. source/partition/offset: the
# record's position (topic or file identity), reported with dead letters. error: null for good
# rows; a reason for rows the runtime must dead-letter instead of processing.
INJECTED_SCHEMA = StructType(
    [
        StructField("stream", StringType(), False),
        StructField("id", BinaryType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("timestamp", LongType(), True),
        StructField("system_time", LongType(), False),
        StructField("source", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("headers", ArrayType(HEADER_TYPE), True),
        StructField("error", StringType(), True),
    ]
)

INJECTED_DDL = (
    "stream string, id binary, key binary, value binary, timestamp bigint, system_time bigint, "
    "source string, partition int, offset bigint, headers array<struct<key:string,value:binary>>, "
    "error string"
)
