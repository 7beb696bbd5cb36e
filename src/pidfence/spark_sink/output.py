"""The sink's output path: its Delta layout, and which batches it committed.

The writer knows its query from Spark; readers, the per-batch report and ``start_sink`` open the
path as the query that owns it (its batches are the ones the log table's transaction id says that
query committed).
"""

from __future__ import annotations

from pidfence.spark_sink import owner
from pidfence.spark_sink.delta.layout import DeltaLayout
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.storage import Store

#: Query id of a Delta layout opened for reading when no query owns the path yet.
NO_OWNER = "noquery0"


def reading_layout(path: str, rejects_path: str | None = None) -> DeltaLayout:
    """The layout of an existing output, for reading what it committed.

    Args:
        path: the sink's ``path``.
        rejects_path: the sink's ``rejectsPath`` (default ``<path>/_rejects``).
    """
    path = path.rstrip("/")
    rejects = (rejects_path or f"{path}/_rejects").rstrip("/")
    query = owner.owner_of(Store.at(f"{path}/{OWN_DIR}")) or NO_OWNER
    return DeltaLayout(path, rejects, query)


def committed_ids(path: str) -> list[int]:
    """The batch ids committed at ``path``, ascending (empty for a new path)."""
    return reading_layout(path).committed_ids()


__all__ = ["committed_ids", "reading_layout"]
