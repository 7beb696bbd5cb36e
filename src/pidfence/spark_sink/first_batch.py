"""A new checkpoint's first batch never skips records quietly.

Spark's Kafka source starts a new query at ``latest`` unless told otherwise: a user's own query
over a topic that already holds records reads none of them, exits 0, and its checkpoint keeps that
start for good. The sink cannot see the source's options, but it sees where the first batch
starts: Spark records the start of a new checkpoint's first batch in ``sources/N/0`` (and the
batch's rows begin there). A start above a partition's offset 0 fails the batch before anything
is published, naming ``startingOffsets`` and the offsets it would skip, unless the sink's own
``startingOffsets`` option says where the source starts (``earliest``: the start is the earliest
offset Kafka still has; ``latest`` or offsets: the skip was asked for).
"""

from __future__ import annotations

from collections.abc import Iterable

from pidfence.spark_sink.errors import SinkError
from pidfence.spark_sink.manifest import PartCommit
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.spark_checkpoint import initial_offsets


class StartSkipsRecords(SinkError):
    """A new checkpoint's first batch starts above a partition's offset 0, and the sink was not
    told that the query starts there on purpose. A rerun from the same checkpoint meets it again:
    the fix is a new checkpoint with ``startingOffsets`` set."""


def check_first_batch(options: SinkOptions, parts: Iterable[PartCommit]) -> None:
    """Refuse a new checkpoint's first batch that starts above offset 0 unasked.

    Args:
        options: the sink's options (its ``checkpoint`` and ``startingOffsets``).
        parts: the batch's partitions as its tasks wrote them.

    Raises:
        StartSkipsRecords: the line names each partition's start and the fix.
    """
    if options.starting_offsets is not None:
        return
    starts = initial_offsets(options.checkpoint) if options.checkpoint else {}
    for part in parts:
        key = (part.topic, part.partition)
        starts[key] = min(starts.get(key, part.kafka_first), part.kafka_first)
    skipped = {tp: start for tp, start in sorted(starts.items()) if start > 0}
    if not skipped:
        return
    where = ", ".join(f"{t}[{p}] offsets 0..{start - 1}" for (t, p), start in skipped.items())
    raise StartSkipsRecords(
        f"this new checkpoint's first batch would never read {sum(skipped.values())} records "
        f"({where}; fewer if retention removed some): Spark's Kafka source starts a new query "
        'at "latest" unless told. Set .option("startingOffsets", "earliest") on the Kafka '
        "source and on the pidfence sink and use a new checkpointLocation; to skip them on "
        'purpose, set the sink\'s .option("startingOffsets", "latest")'
    )


__all__ = ["StartSkipsRecords", "check_first_batch"]
