"""What the sink requires of its output and checkpoint, checked before a JVM starts.

``pidfence sink`` (and :func:`~pidfence.spark_sink.pipeline.start_sink`) refuse here, writing
nothing, what the query would refuse later: an output it cannot write (another writer's Delta
table, another pidfence table format, columns removed), a path another query owns, a Delta table
that is gone although batches were committed to it. And they learn where the run starts from
Spark's checkpoint, for the progress bar.
"""

from __future__ import annotations

from pidfence.spark_sink import conditional, owner
from pidfence.spark_sink.checkpoint import checkpoint_committed
from pidfence.spark_sink.object_store import is_s3
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.storage import Store


def check_output(options: SinkOptions, checkpoint: str | None) -> None:
    """Refuse an output the sink cannot write with ``options``, before anything starts.

    Raises:
        NotPidfenceTable: another writer's Delta table, the other kind, or stray files.
        SchemaChanged: a column the sink writes was removed or retyped.
        TableGone: the checkpoint committed batches, and the Delta table is gone.
        OutputOwnedError: another query owns the output.
        StoreIgnoresConditions: the output's object store ignores conditional puts.
    """
    from pidfence.spark_sink.delta.errors import TableGone
    from pidfence.spark_sink.delta.table import OWN_DIR, check_path

    found = [check_path(options.path, "log"), check_path(options.rejects_path, "rejects")]
    if not all(found) and checkpoint_committed(checkpoint):
        missing = options.path if not found[0] else options.rejects_path
        raise TableGone(
            f"{missing}: checkpoint {checkpoint} committed batches to a Delta table here, "
            "and it is gone. Restore it from a backup, or start a new --output with a new "
            "--checkpoint"
        )
    owner.check_owner(Store.at(f"{options.path}/{OWN_DIR}"), checkpoint)
    if is_s3(options.path):
        conditional.probe(Store.at(options.path).root, options.path)


def records_to_read(
    watermarks: dict[tuple[str, int], tuple[int, int]], starts: dict[tuple[str, int], int]
) -> int:
    """Records between each partition's start and its high watermark."""
    return sum(
        max(0, high - max(low, starts.get(tp, low))) for tp, (low, high) in watermarks.items()
    )


__all__ = ["check_output", "records_to_read"]
