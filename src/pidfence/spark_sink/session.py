"""Any SparkSession gets the sink: Spark's Kafka connector matched to the installed pyspark.

The sink is a Python data source (``format("pidfence")``): what a session needs beyond pyspark is
the Kafka connector's jars on the JVM side and pidfence installed wherever Python workers run.
:func:`configure` adds the jars to a builder, as delta-spark's ``configure_spark_with_delta_pip``
does; :func:`packages` names them by Maven coordinates for ``--packages`` and cluster libraries.
:func:`register` then adds ``format("pidfence")`` to a session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pidfence.jars import connector_jars, connector_module
from pidfence.spark_sink.object_store import session_conf


def packages() -> str:
    """The Maven coordinates the sink needs, for ``spark.jars.packages`` or
    ``spark-submit --packages`` (e.g. ``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0``)."""
    return str(connector_module())


def configure(builder: Any, jars: str | Path | None = None, object_store: bool = False) -> Any:
    """Add the Kafka connector's jars to a ``SparkSession.Builder`` (before ``getOrCreate()``).

    Args:
        builder: ``SparkSession.builder`` with the user's own settings; a ``spark.jars`` it
            already has is kept.
        jars: a folder holding the connector and its dependencies, for a machine without
            network; else ``$PIDFENCE_JARS``, else the jar cache, fetched from Maven Central on
            first use (with a progress line) and used offline afterwards.
        object_store: also Spark's S3A file system for an ``s3://`` or ``s3a://`` checkpoint:
            hadoop-aws and the AWS SDK bundle matched to pyspark's Hadoop (fetched likewise),
            configured from the AWS environment (:mod:`pidfence.spark_sink.object_store`).

    Returns:
        The builder. After ``getOrCreate()``, :func:`pidfence.spark_sink.register` adds
        ``format("pidfence")`` to the session.
    """
    paths = [str(p) for p in connector_jars(jars)]
    existing = getattr(builder, "_options", {}).get("spark.jars")
    builder = builder.config("spark.jars", ",".join([existing, *paths] if existing else paths))
    for key, value in session_conf(["s3://"] if object_store else []).items():
        builder = builder.config(key, value)
    return builder


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


__all__ = ["configure", "packages", "register"]
