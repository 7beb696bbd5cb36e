"""Paths on an object store, as each library names them, and Spark's ``s3a`` settings.

A user names an S3 folder ``s3://bucket/prefix`` (Spark users also ``s3a://``). pyarrow, delta-rs
and boto3 know ``s3://``; Hadoop's file system (Spark's checkpoint) knows ``s3a://``, and maps
``s3://`` to the same S3A file system here. All of them find the store and its credentials in the
standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``); :func:`spark_conf` hands the same to S3A, and to executors
on other machines. ``--storage-option KEY=VALUE`` sets one more such variable, or an
``fs.s3a.*`` setting of Spark's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from pidfence.spark_sink.errors import SinkOptionError

_S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URI of a store (``s3://`` …), not a local path."""
    return "://" in path and not path.startswith("file://")


def is_s3(path: str) -> bool:
    """Whether ``path`` names an S3 folder (``s3://`` or ``s3a://``)."""
    return path.startswith(("s3://", "s3a://"))


def arrow_uri(path: str) -> str:
    """``path`` as pyarrow and delta-rs name it (``s3a://`` becomes ``s3://``)."""
    return "s3://" + path.removeprefix("s3a://") if path.startswith("s3a://") else path


def storage_options(pairs: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs of ``--storage-option``, checked.

    Raises:
        SinkOptionError: a pair without ``=``, or a key that is neither an ``AWS_*``
            environment variable nor an ``fs.s3a.*`` setting.
    """
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not (key.startswith("AWS_") or key.startswith("fs.s3a.")):
            raise SinkOptionError(
                f"--storage-option {pair!r}: give KEY=VALUE with an AWS_* variable (e.g. "
                "AWS_REGION=eu-west-1) or a Spark S3A setting (fs.s3a.*)"
            )
        options[key] = value
    return options


def apply(options: Mapping[str, str]) -> None:
    """Put the ``AWS_*`` storage options into this process's environment: pyarrow, delta-rs
    and boto3 read them there, and Python workers inherit them."""
    os.environ.update({k: v for k, v in options.items() if k.startswith("AWS_")})


def spark_conf(options: Mapping[str, str] | None = None, master: str = "local") -> dict[str, str]:
    """Spark settings for S3 paths: S3A for ``s3://`` and ``s3a://``, its endpoint and region
    from the AWS environment, path-style access, and the ``fs.s3a.*`` storage options.

    S3A reads the credentials from the environment itself (its default provider chain), so no
    secret goes on the driver's command line. Executors of a cluster (``master`` not
    ``local``) get the ``AWS_*`` environment through ``spark.executorEnv``; local ones inherit it.
    """
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    conf = {
        "spark.hadoop.fs.s3.impl": _S3A,
        "spark.hadoop.fs.s3a.impl": _S3A,
        # Spark's checkpoint goes through Hadoop's FileContext, which wants these too.
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.AbstractFileSystem.s3a.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.s3a.path.style.access": "true",
    }
    if endpoint := env.get("AWS_ENDPOINT_URL"):
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        ssl = urlsplit(endpoint).scheme != "http"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(ssl).lower()
    if region := env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"):
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    if not master.startswith("local"):
        conf.update({f"spark.executorEnv.{k}": v for k, v in env.items()})
    conf.update({f"spark.hadoop.{k}": v for k, v in (options or {}).items() if k[:3] == "fs."})
    return conf


def s3a_jars() -> list[Path]:
    """hadoop-aws and the AWS SDK bundle for pyspark's Hadoop (fetched on first use)."""
    from pidfence.jars import jars

    return jars("hadoop-aws")


def session_conf(
    paths: Iterable[str], options: Mapping[str, str] | None = None, master: str = "local"
) -> dict[str, str]:
    """Settings a new SparkSession needs for ``paths``: none when all are local; for S3, the S3A
    jars on the driver's class path (only the driver touches the checkpoint: executors write
    through pyarrow and delta-rs) and :func:`spark_conf`."""
    if not any(is_s3(p) for p in paths):
        return {}
    classpath = os.pathsep.join(str(p) for p in s3a_jars())
    return {**spark_conf(options, master), "spark.driver.extraClassPath": classpath}


__all__ = [
    "apply",
    "arrow_uri",
    "is_remote",
    "is_s3",
    "s3a_jars",
    "session_conf",
    "spark_conf",
    "storage_options",
]
