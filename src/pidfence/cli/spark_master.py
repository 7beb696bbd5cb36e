"""``--master``: a Spark master URL, checked before any JVM starts."""

from __future__ import annotations

import os
import re
from typing import Annotated

import typer

#: Spark's master URLs (SparkContext's own patterns, and the cluster managers' schemes Spark 4
#: accepts: it refuses ``mesos://``).
_MASTER = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|(spark|k8s)://\S+"
)
#: Where spark-submit looks for the YARN cluster's configuration (it refuses ``yarn`` without).
HADOOP_CONF_ENV = ("HADOOP_CONF_DIR", "YARN_CONF_DIR")


def spark_master(value: str) -> str:
    """``--master``, or a usage error (exit 2) for a URL Spark cannot parse, or ``yarn`` with no
    cluster configuration to find the ResourceManager in, before any JVM starts: Spark's own
    refusal would look like a failed start, which a rerun does not get past."""
    if not _MASTER.fullmatch(value):
        raise typer.BadParameter(
            f"{value!r} is not a Spark master URL: local[*], local[N], local[N,F], "
            "spark://HOST:PORT, yarn or k8s://..."
        )
    if value == "yarn" and not any(os.environ.get(name) for name in HADOOP_CONF_ENV):
        raise typer.BadParameter(
            "yarn needs the cluster's configuration: set HADOOP_CONF_DIR (or YARN_CONF_DIR) to "
            "the folder holding its yarn-site.xml and core-site.xml"
        )
    return value


#: The ``--master`` option.
SparkMaster = Annotated[
    str,
    typer.Option(
        help="Spark master: local[*], local[N,F], spark://HOST:PORT, yarn (with "
        "HADOOP_CONF_DIR) or k8s://...",
        callback=spark_master,
    ),
]
