"""What the sink requires of its output and checkpoint, checked before a JVM starts.

``pidfence sink`` (and :func:`~pidfence.spark_sink.pipeline.start_sink`) refuse here, writing
nothing, what the query would refuse later: an output it cannot write (another writer's Delta
table, another pidfence table format, columns removed), a path another query owns, a Delta table
that is gone although batches were committed to it. And they learn where the run starts from
Spark's checkpoint, for the progress bar.
"""

from __future__ import annotations

from pathlib import Path

from pidfence.spark_sink import query_owner, s3_requests
from pidfence.spark_sink.delta.table import check_tables
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.object_store import arrow_uri, is_remote, is_s3
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import NO_OWNER, Output
from pidfence.spark_sink.spark_checkpoint import checkpoint_committed


def _where(path: str) -> str:
    if is_remote(path):
        return arrow_uri(path).rstrip("/")
    return str(Path(path.removeprefix("file://")).resolve())


def check_apart(output: str, checkpoint: str | None) -> None:
    """Refuse a checkpoint at the output folder or inside it: the output holds the sink's tables
    and nothing else, so Spark's files there would be stray files the sink refuses later.

    Raises:
        SinkOptionError: the checkpoint is the output folder or below it (the message names a
            place next to it).
    """
    if checkpoint is None:
        return
    out, ckpt = _where(output), _where(checkpoint)
    if ckpt == out or ckpt.startswith(f"{out}/"):
        where = "is the output folder" if ckpt == out else f"is inside the output {output}"
        raise SinkOptionError(
            f"--checkpoint {checkpoint} {where}, which holds only the sink's tables; put the "
            f"checkpoint next to it (e.g. --checkpoint {output.rstrip('/')}-ckpt)"
        )


def check_output(options: SinkOptions, checkpoint: str | None) -> Output:
    """Refuse an output the sink cannot write with ``options``, before anything starts; the
    output, checked, when it may be written.

    Raises:
        SinkOptionError: the checkpoint is the output folder or inside it.
        NotPidfenceTable: another writer's Delta table, the other kind, or stray files.
        SchemaChanged: a column the sink writes was removed or retyped.
        TableGone: the checkpoint committed batches, and the Delta table is gone.
        OutputOwnedError: another query owns the output.
        StoreUnusable: the output's bucket is missing, the store refused the credentials, or
            no store answered.
        StoreIgnoresConditions: the output's object store ignores conditional puts.
    """
    check_apart(options.path, checkpoint)
    s3_requests.reach_stores(options.path)  # before pyarrow's S3 file system asks the region
    output = Output(options.path, options.rejects_path, NO_OWNER)
    check_tables(output.log, output.rejects, lambda: checkpoint_committed(checkpoint))
    query_owner.check_owner(output.own, checkpoint)
    if is_s3(options.path):
        s3_requests.probe(output.log.root, options.path)
    return output


def records_to_read(
    watermarks: dict[tuple[str, int], tuple[int, int]], starts: dict[tuple[str, int], int]
) -> int:
    """Records between each partition's start and its high watermark."""
    return sum(
        max(0, high - max(low, starts.get(tp, low))) for tp, (low, high) in watermarks.items()
    )


__all__ = ["check_apart", "check_output", "records_to_read"]
