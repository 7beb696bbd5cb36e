"""The ``pidfence`` Spark sink (DESIGN §7): exactly-once output log through the broker rules.

Usage::

    from pyspark.sql import SparkSession
    from pidfence.spark_sink import configure, register
    spark = configure(SparkSession.builder).getOrCreate()  # the Kafka connector's jars
    register(spark)
    kafka_df.writeStream.format("pidfence").option("path", P).option("checkpointLocation", C)
"""

from __future__ import annotations

from pidfence.spark_sink.batch_report import BatchLine, SinkRunSummary
from pidfence.spark_sink.errors import (
    SinkError,
    SinkOptionError,
    SplitPartitionError,
)
from pidfence.spark_sink.options import SinkOptions, parse_duration_ms
from pidfence.spark_sink.pipeline import (
    build_query,
    run_sink,
    serve,
    start_sink,
)
from pidfence.spark_sink.readers import read_gaps, read_log, read_rejects, read_written
from pidfence.spark_sink.session import configure, packages, register

__all__ = [
    "BatchLine",
    "SinkError",
    "SinkOptionError",
    "SinkOptions",
    "SinkRunSummary",
    "SplitPartitionError",
    "build_query",
    "configure",
    "packages",
    "parse_duration_ms",
    "read_gaps",
    "read_log",
    "read_rejects",
    "read_written",
    "register",
    "run_sink",
    "serve",
    "start_sink",
]
