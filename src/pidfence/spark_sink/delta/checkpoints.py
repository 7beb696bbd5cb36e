"""Delta log checkpoints and log cleanup after the sink's commits.

A table with no checkpoint makes every reader replay its JSON commits from version 0. The sink
writes one whenever the newest is ``delta.checkpointInterval`` versions old (Delta Lake's
default, 10, unless the table sets another; delta-rs alone would wait 100), whoever wrote the
commits in between, and then removes log files older than the table's
``delta.logRetentionDuration`` (Delta's default 30 days; the tables the sink creates: 1 hour)
unless ``delta.enableExpiredLogCleanup`` is ``false``, as Delta's own writers do.
"""

from __future__ import annotations

import json
import logging
from typing import Final

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from pidfence.spark_sink.storage import Store

#: Delta Lake's default ``delta.checkpointInterval``.
DEFAULT_CHECKPOINT_INTERVAL: Final = 10
_LOG = logging.getLogger(__name__)


def last_checkpoint(table: Store) -> int:
    """The version of the table's newest checkpoint (``_delta_log/_last_checkpoint``), or -1."""
    try:
        return int(json.loads(table.read(table.join("_delta_log", "_last_checkpoint")))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def checkpoint_interval(dt: DeltaTable) -> int:
    """The table's ``delta.checkpointInterval``, else Delta Lake's default (10)."""
    raw = dt.metadata().configuration.get("delta.checkpointInterval")
    try:
        value = int(raw) if raw is not None else DEFAULT_CHECKPOINT_INTERVAL
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL
    return value if value > 0 else DEFAULT_CHECKPOINT_INTERVAL


def maybe_checkpoint(dt: DeltaTable, table: Store, version: int) -> bool:
    """Write a checkpoint at ``version`` when the newest one is ``interval`` or more versions
    old, then clean log files past ``delta.logRetentionDuration`` (unless the table turned
    ``delta.enableExpiredLogCleanup`` off). Returns whether it wrote one.

    A failure is logged, not raised: the batch is committed; the next commit tries again.
    """
    # Counted from version 0 when there is none yet: at 10, 20 … as Spark's Delta writer does.
    if version - max(0, last_checkpoint(table)) < checkpoint_interval(dt):
        return False
    try:
        dt.update_incremental()
        dt.create_checkpoint()
        cleanup = dt.metadata().configuration.get("delta.enableExpiredLogCleanup", "true")
        if cleanup.strip().lower() != "false":
            dt.cleanup_metadata()
    except (DeltaError, OSError) as exc:
        _LOG.warning("%s: checkpoint at version %d failed: %s", table.uri, version, exc)
        return False
    return True


__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL",
    "checkpoint_interval",
    "last_checkpoint",
    "maybe_checkpoint",
]
