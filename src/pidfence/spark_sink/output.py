"""One output path, whichever table format holds it: its layout, and which batches it committed.

The writer knows its format from its options; readers, the per-batch report and ``start_sink``
look at the path instead: a Delta table at the root is the Delta layout (its batches are the ones
the log table's transaction id says its owner query committed), anything else the manifest
layout.
"""

from __future__ import annotations

from pidfence.spark_sink import owner
from pidfence.spark_sink.delta.table import OWN_DIR, holds_delta
from pidfence.spark_sink.layout import ParquetLayout
from pidfence.spark_sink.storage import Store

#: Query id of a Delta layout opened for reading when no query owns the path yet.
NO_OWNER = "noquery0"


def is_delta(path: str) -> bool:
    """Whether ``path`` holds the Delta layout (a Delta table at its root)."""
    try:
        return holds_delta(path)
    except Exception:  # noqa: BLE001 - an unreadable path is not a Delta table (yet)
        return False


def reading_layout(path: str, rejects_path: str | None = None) -> ParquetLayout:
    """The layout of an existing output, for reading what it committed.

    Args:
        path: the sink's ``path``.
        rejects_path: the sink's ``rejectsPath`` (default ``<path>/_rejects``).
    """
    path = path.rstrip("/")
    rejects = (rejects_path or f"{path}/_rejects").rstrip("/")
    if not is_delta(path):
        return ParquetLayout(path, rejects)
    from pidfence.spark_sink.delta.layout import DeltaLayout

    query = owner.owner_of(Store.at(f"{path}/{OWN_DIR}")) or NO_OWNER
    return DeltaLayout(path, rejects, query)


def committed_ids(path: str) -> list[int]:
    """The batch ids committed at ``path``, ascending (empty for a new path)."""
    return reading_layout(path).committed_ids()


__all__ = ["committed_ids", "is_delta", "reading_layout"]
