"""The JVM jars pidfence uses, by Maven coordinates.

* ``zookeeper`` and ``kafka``: the embedded services' servers (``pidfence services``, the tests).
* ``spark-kafka``: Spark's Kafka connector for the installed pyspark, with the dependencies that
  pyspark does not ship (the sink reads Kafka through it).
* ``hadoop-aws``: Spark's ``s3a://`` file system matched to pyspark's Hadoop, with the AWS SDK
  bundle (a checkpoint on an object store; fetched only when one is used: the bundle is large).
* ``delta``: ``delta-spark`` for the installed Spark, its own two jars only, to read the sink's
  table with ``spark.read.format("delta")`` (the sink itself commits with the ``deltalake``
  package and never needs it).

The Spark components are matched to the installed pyspark's Spark and Scala versions, so a user
may run any pyspark the ``sink`` extra allows. For a cluster without network,
``pidfence sink --jars DIR`` (or ``$PIDFENCE_JARS``) takes the connector from a folder instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from pidfence.jars.cache import Component, fetch
from pidfence.jars.errors import JarsMissing
from pidfence.jars.ivy import Module

KAFKA_VERSION = "4.1.1"
ZOOKEEPER_VERSION = "3.9.4"
LOG4J_VERSION = "2.24.3"
#: The delta-spark release built against each Spark minor version.
DELTA_FOR_SPARK = {"4.2": "4.4.0"}
#: A folder of jars to take Spark's Kafka connector from instead of the cache.
JARS_ENV = "PIDFENCE_JARS"
#: ``-VERSION.jar``: from the first ``-`` and digit that is not a Kafka connector's ``-0-10_2.13``.
_VERSION_SUFFIX = re.compile(r"-(?!\d+(?:-\d+)*_\d)\d[\w.\-]*\.jar$")


def artifact_of(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``; ``spark-sql-kafka-0-10_2.13-4.2.0.jar``
    -> ``spark-sql-kafka-0-10_2.13``."""
    return _VERSION_SUFFIX.sub("", jar_name)


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder of the installed pyspark (Spark's own jars)."""
    try:
        import pyspark
    except ImportError as exc:
        raise JarsMissing(
            "pyspark is not installed (Spark's jars are matched to it): "
            "pip install 'pidfence[sink]'"
        ) from exc
    return Path(pyspark.__file__).parent / "jars"


def spark_versions() -> tuple[str, str]:
    """``(spark, scala)`` versions of the installed pyspark, e.g. ``("4.2.0", "2.13")``."""
    for jar in pyspark_jars_dir().glob("spark-core_*.jar"):
        if match := re.fullmatch(r"spark-core_(\d+\.\d+)-(.+)\.jar", jar.name):
            return match.group(2), match.group(1)
    raise JarsMissing(f"no spark-core jar in {pyspark_jars_dir()}: reinstall pyspark")


def kafka() -> Component:
    """The Kafka broker (KRaft) and the logging it needs."""
    return Component(
        f"kafka_2.13-{KAFKA_VERSION}",
        (
            Module("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
            # Kafka's own pom resolves slf4j-api 1.7, which cannot see log4j's slf4j 2 provider.
            Module("org.slf4j", "slf4j-api", "2.0.16"),
            Module("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
            Module("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ),
    )


def zookeeper() -> Component:
    """The ZooKeeper server (the lease server's pid counter)."""
    return Component(
        f"zookeeper-{ZOOKEEPER_VERSION}",
        (
            Module("org.apache.zookeeper", "zookeeper", ZOOKEEPER_VERSION),
            # Optional in ZooKeeper's pom, required by the server at run time.
            Module("io.dropwizard.metrics", "metrics-core", "4.1.12.1"),
            Module("org.slf4j", "slf4j-simple", "2.0.13"),
            Module("org.xerial.snappy", "snappy-java", "1.1.10.5"),
        ),
    )


def pyspark_artifacts() -> dict[str, str]:
    """``{artifact: version}`` of the jars pyspark ships (``hadoop-client-api``: ``3.5.0``): a
    component for Spark leaves them out (``Component(provided=...)``) and matches them."""
    names = (p.name for p in pyspark_jars_dir().glob("*.jar"))
    return {(a := artifact_of(n)): n[len(a) + 1 : -len(".jar")] for n in names}


def connector_module() -> Module:
    """Spark's Kafka connector for the installed pyspark (what ``--packages`` names)."""
    spark, scala = spark_versions()
    return Module("org.apache.spark", f"spark-sql-kafka-0-10_{scala}", spark)


def spark_kafka() -> Component:
    """The Kafka connector and what pyspark lacks of its dependencies."""
    module = connector_module()
    provided = frozenset(pyspark_artifacts())
    return Component(f"{module.artifact}-{module.version}", (module,), provided)


def delta() -> Component:
    """``delta-spark`` and ``delta-storage`` for the installed Spark (their own jars only)."""
    spark, scala = spark_versions()
    version = DELTA_FOR_SPARK.get(spark.rsplit(".", 1)[0])
    if version is None:
        raise JarsMissing(
            f"pidfence knows no delta-spark release for Spark {spark} (it knows Spark "
            f"{', '.join(DELTA_FOR_SPARK)}): add delta-spark's jars to your session yourself"
        )
    return Component(
        f"delta-spark_{scala}-{version}",
        (
            Module("io.delta", f"delta-spark_{scala}", version, transitive=False),
            Module("io.delta", "delta-storage", version, transitive=False),
        ),
    )


def hadoop_aws() -> Component:
    """``hadoop-aws`` matched to pyspark's Hadoop, with the AWS SDK bundle it needs: Spark's
    ``s3a://`` file system (a checkpoint on an object store)."""
    provided = pyspark_artifacts()
    version = provided["hadoop-client-api"]
    module = Module("org.apache.hadoop", "hadoop-aws", version)
    return Component(f"hadoop-aws-{version}", (module,), frozenset(provided))


#: Every component by the name ``pidfence jars`` and :func:`jars` take.
COMPONENTS: dict[str, Callable[[], Component]] = {
    "zookeeper": zookeeper,
    "kafka": kafka,
    "spark-kafka": spark_kafka,
    "delta": delta,
    "hadoop-aws": hadoop_aws,
}


def jars(name: str) -> list[Path]:
    """The jars of one component (:data:`COMPONENTS`), fetched on first use."""
    if name not in COMPONENTS:
        raise ValueError(f"unknown component {name!r}; expected one of {', '.join(COMPONENTS)}")
    return fetch(COMPONENTS[name]())


def classpath(name: str) -> str:
    """A Java classpath of one component's jars."""
    return os.pathsep.join(str(p) for p in jars(name))


def connector_jars(folder: str | Path | None = None) -> list[Path]:
    """Spark's Kafka connector and its dependencies for the installed pyspark.

    From ``folder`` (else ``$PIDFENCE_JARS``) when given: every jar there except those pyspark
    ships, provided the connector matching pyspark is among them. Else from the cache, fetched
    on first use.
    """
    folder = folder or os.environ.get(JARS_ENV)
    if not folder:
        return jars("spark-kafka")
    module = connector_module()
    wanted = f"{module.artifact}-{module.version}.jar"
    found = sorted(Path(folder).glob("*.jar"))
    if not any(p.name == wanted for p in found):
        raise JarsMissing(
            f"{folder} has no {wanted} (Spark's Kafka connector for the installed pyspark): "
            f"put it there with its dependencies (`pidfence jars spark-kafka --to {folder}` on "
            f"a machine with network does), or drop --jars/{JARS_ENV} to fetch them"
        )
    provided = pyspark_artifacts()
    return [p for p in found if artifact_of(p.name) not in provided]
