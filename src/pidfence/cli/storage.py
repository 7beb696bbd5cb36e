"""``--storage-option KEY=VALUE``: the one option of every command that reads or writes an
``s3://`` path (``sink``, ``verify``, ``sink compact``, ``sink vacuum``)."""

from __future__ import annotations

from typing import Annotated

import typer

StorageOption = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        help="KEY=VALUE for an s3:// path (repeatable): an AWS_* variable (beside the AWS "
        "environment the store is read from) or a Spark S3A setting (fs.s3a.*)",
    ),
]


def apply_storage_options(pairs: list[str] | None) -> dict[str, str]:
    """Check ``--storage-option`` pairs and put the ``AWS_*`` ones into this process's
    environment (pyarrow, delta-rs and boto3 read them there); returns them all.

    Raises:
        SinkOptionError: a pair is not ``KEY=VALUE`` with an ``AWS_*`` or ``fs.s3a.*`` key.
    """
    from pidfence.spark_sink import object_store

    options = object_store.storage_options(pairs or [])
    object_store.apply(options)
    return options
