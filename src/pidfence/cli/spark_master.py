"""``--master``: a Spark master URL, checked before any JVM starts."""

from __future__ import annotations

import re
from typing import Annotated

import typer

#: Spark's master URLs (SparkContext's own patterns, and the cluster managers' schemes).
_MASTER = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|"
    r"(spark|k8s|mesos)://\S+"
)


def spark_master(value: str) -> str:
    """``--master``, or a usage error (exit 2) for a URL Spark cannot parse, before any JVM
    starts: Spark's own refusal would look like a failed start, which a rerun does not get
    past."""
    if not _MASTER.fullmatch(value):
        raise typer.BadParameter(
            f"{value!r} is not a Spark master URL: local[*], local[N], local[N,F], "
            "spark://HOST:PORT, yarn, k8s://... or mesos://..."
        )
    return value


#: The ``--master`` option.
SparkMaster = Annotated[
    str,
    typer.Option(
        help="Spark master: local[*], local[N,F], spark://HOST:PORT, yarn or k8s://...",
        callback=spark_master,
    ),
]
