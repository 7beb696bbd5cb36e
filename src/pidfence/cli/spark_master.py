"""``--master``: a Spark master URL, checked before any JVM starts."""

from __future__ import annotations

import re
from typing import Annotated

import typer

#: Spark's master URLs (SparkContext's own patterns, and the cluster managers' schemes Spark 4
#: accepts: it refuses ``mesos://``).
_MASTER = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|(spark|k8s)://\S+"
)


def spark_master(value: str) -> str:
    """``--master``, or a usage error (exit 2) for a URL Spark cannot parse, before any JVM
    starts. (``yarn`` without ``HADOOP_CONF_DIR`` is Spark's to refuse: spark-submit may read it
    from ``spark-env.sh``; its refusal is a start that failed, exit 3 with the cause.)"""
    if not _MASTER.fullmatch(value):
        raise typer.BadParameter(
            f"{value!r} is not a Spark master URL: local[*], local[N], local[N,F], "
            "spark://HOST:PORT, yarn or k8s://..."
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
