"""The ``pidfence`` Spark sink (DESIGN §7): exactly-once output log through the broker rules.

Usage::

    from pyspark.sql import SparkSession
    from pidfence.spark_sink import configure, register
    spark = configure(SparkSession.builder).getOrCreate()  # the Kafka connector's jars
    register(spark)
    kafka_df.writeStream.format("pidfence").option("path", P).option("checkpointLocation", C)
"""

from __future__ import annotations

from typing import Any

from pidfence.spark_sink.errors import (
    InjectedFault,
    SinkError,
    SinkOptionError,
    SplitPartitionError,
)
from pidfence.spark_sink.options import SinkOptions, parse_duration_ms
from pidfence.spark_sink.pipeline import (
    BatchLine,
    SinkRunSummary,
    build_query,
    run_sink,
    serve,
    start_sink,
)
from pidfence.spark_sink.readers import read_gaps, read_log, read_rejects, read_written
from pidfence.spark_sink.session import configure, packages


def register(spark: Any) -> None:
    """Register ``format("pidfence")`` with a SparkSession, and make it this thread's active one.

    Spark looks Python data sources up through the JVM thread's active session; a session built
    on another thread (e.g. started in the background while producers run) is not active here,
    and ``start()`` would fail with ``DATA_SOURCE_NOT_FOUND``.
    """
    from pyspark.errors import AnalysisException

    from pidfence.spark_sink.source import PidfenceDataSource

    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    try:
        spark.dataSource.register(PidfenceDataSource)
    except AnalysisException as exc:
        # Registering twice (a second register() on a session, or a JVM that already knows
        # the source) is harmless: the class is the same. Anything else is a real failure.
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise


__all__ = [
    "BatchLine",
    "InjectedFault",
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
