"""JVM jars by Maven coordinates, fetched into the user's cache on first use.

``fetch(Component(...))`` turns coordinates into a verified folder of local jars (Apache Ivy,
standalone, against Maven Central or ``$PIDFENCE_MAVEN_REPOSITORY``); :func:`jars` and
:func:`classpath` give pidfence's own components (ZooKeeper, Kafka, Spark's Kafka connector and
Delta matched to the installed pyspark). Nothing here needs a checkout, Maven or pyspark, except
the Spark components, which need pyspark to match. Another Spark dependency is one more
``Component``, e.g. hadoop-aws matched to pyspark's Hadoop::

    hadoop = pyspark_artifacts()["hadoop-client-api"]
    fetch(Component(f"hadoop-aws-{hadoop}", (Module("org.apache.hadoop", "hadoop-aws", hadoop),),
                    frozenset(pyspark_artifacts())))
"""

from pidfence.jars.cache import CACHE_ENV, Component, cache_dir, cached, fetch, user_cache
from pidfence.jars.components import (
    COMPONENTS,
    JARS_ENV,
    artifact_of,
    classpath,
    connector_jars,
    connector_module,
    jars,
    pyspark_artifacts,
    pyspark_jars_dir,
    spark_versions,
)
from pidfence.jars.errors import FetchFailed, JarsError, JarsMissing, MissingTool
from pidfence.jars.ivy import REPOSITORY_ENV, Module, java, repository, require_java

__all__ = [
    # fetching
    "CACHE_ENV",
    "REPOSITORY_ENV",
    "Component",
    "Module",
    "cache_dir",
    "cached",
    "fetch",
    "java",
    "repository",
    "require_java",
    "user_cache",
    # pidfence's components
    "COMPONENTS",
    "JARS_ENV",
    "artifact_of",
    "classpath",
    "connector_jars",
    "connector_module",
    "jars",
    "pyspark_artifacts",
    "pyspark_jars_dir",
    "spark_versions",
    # errors
    "FetchFailed",
    "JarsError",
    "JarsMissing",
    "MissingTool",
]
