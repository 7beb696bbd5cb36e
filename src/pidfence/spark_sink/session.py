"""Any SparkSession gets the sink: Spark's Kafka connector matched to the installed pyspark.

The sink is a Python data source (``format("pidfence")``): what a session needs beyond pyspark is
the Kafka connector's jars on the JVM side and pidfence installed wherever Python workers run.
:func:`configure` adds the jars to a builder, as delta-spark's ``configure_spark_with_delta_pip``
does; :func:`packages` names them by Maven coordinates for ``--packages`` and cluster libraries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pidfence.jars import connector_jars, connector_module


def packages() -> str:
    """The Maven coordinates the sink needs, for ``spark.jars.packages`` or
    ``spark-submit --packages`` (e.g. ``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0``)."""
    return str(connector_module())


def configure(builder: Any, jars: str | Path | None = None) -> Any:
    """Add the Kafka connector's jars to a ``SparkSession.Builder`` (before ``getOrCreate()``).

    Args:
        builder: ``SparkSession.builder`` with the user's own settings; a ``spark.jars`` it
            already has is kept.
        jars: a folder holding the connector and its dependencies, for a machine without
            network; else ``$PIDFENCE_JARS``, else the jar cache, fetched from Maven Central on
            first use (with a progress line) and used offline afterwards.

    Returns:
        The builder. After ``getOrCreate()``, :func:`pidfence.spark_sink.register` adds
        ``format("pidfence")`` to the session.
    """
    paths = [str(p) for p in connector_jars(jars)]
    existing = getattr(builder, "_options", {}).get("spark.jars")
    return builder.config("spark.jars", ",".join([existing, *paths] if existing else paths))


__all__ = ["configure", "packages"]
