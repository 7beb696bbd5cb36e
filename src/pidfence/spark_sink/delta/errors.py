"""Errors of the Delta layer: not retriable unless a class says so (``retriable``).

What other writers do to the table never stops the sink (appends beside it, properties,
comments, constraints its rows satisfy, OPTIMIZE, VACUUM, DELETE, checkpoints, log cleanup). The
:class:`CannotContinue` errors are what it truly cannot continue from; their message names the
commit version, the operation and what to do.
"""

from __future__ import annotations

from typing import ClassVar

from pidfence.spark_sink.errors import SinkError


class DeltaTableError(SinkError):
    """Base class of the Delta layer's errors."""


class NotPidfenceTable(DeltaTableError):
    """The path holds something other than a pidfence table of this kind; nothing was written."""


class CannotContinue(DeltaTableError):
    """Another writer changed the table in a way the sink cannot continue from.

    Nothing of the running batch was committed; running again fails the same way until the
    table is put right (the message says how).
    """


class SchemaChanged(CannotContinue):
    """A column the sink writes was removed or retyped (added columns are fine)."""


class RestoredPastSink(CannotContinue):
    """A RESTORE took the table back to before the sink's last committed batch."""


class TableGone(CannotContinue):
    """The table the sink committed batches to is gone (deleted, or its Delta log removed)."""

    @classmethod
    def replaced(
        cls, uri: str, query: str, holds: int = -1, committed: int | None = None
    ) -> TableGone:
        """The log table at ``uri`` holds ``query``'s batches only up to ``holds`` (-1: none),
        where the checkpoint says it committed them up to ``committed`` (None: some)."""
        if holds < 0:
            held = "holds none of them: it was replaced (deleted and created again, or restored "
            held += "from a copy older than the query's first batch)"
        else:
            held = f"holds them only up to batch {holds}: it was restored from a copy older "
            held += "than the batches after that"
        upto = "" if committed is None else f" up to batch {committed}"
        return cls(
            f"{uri}: the checkpoint says query {query} committed batches here{upto}, and the "
            f"Delta table {held}. Restore the table the query wrote, or start a new --output "
            "with a new --checkpoint"
        )


class DataFileMissing(CannotContinue):
    """A data file the table's current version adds is not in the store: it was deleted
    outside Delta, and its rows with it. A rerun meets it again."""

    @classmethod
    def at(cls, uri: str, version: int, file: str) -> DataFileMissing:
        """The table at ``uri`` adds ``file`` (relative to its root) at ``version``."""
        return cls(
            f"{uri}: version {version} of the Delta table adds {file}, which the store does not "
            "have (deleted outside Delta, with its rows). Put the file back from a backup; or, "
            "accepting the loss of its rows, remove it from the table with Delta's FSCK REPAIR "
            "TABLE"
        )


class VersionVacuumed(DeltaTableError):
    """A file of the table version a command read was removed by a newer commit and vacuumed
    while the command ran; nothing was committed. Retriable: a rerun reads the newer version."""

    retriable: ClassVar[bool] = True


class ConstraintViolated(CannotContinue):
    """A CHECK constraint of the table rejects rows of the batch (or cannot be evaluated)."""


class DeltaCommitConflict(DeltaTableError):
    """Concurrent commits beat this batch's commit too often; nothing of it was committed.

    Retriable: re-run the batch (Spark re-runs it from its checkpoint); a batch that turns out to
    be committed already is then a no-op.
    """

    retriable: ClassVar[bool] = True


class StagedFileMissing(DeltaTableError):
    """A file the batch's tasks wrote is gone before its commit; nothing was committed.

    Retriable: re-running the whole batch (its ``write()`` tasks too) writes the files again,
    and they replace a manifest that names a missing file, unless the rejects table committed
    the batch already (then a rerun meets the same missing file).
    """

    retriable: ClassVar[bool] = True


__all__ = [
    "CannotContinue",
    "ConstraintViolated",
    "DataFileMissing",
    "DeltaCommitConflict",
    "DeltaTableError",
    "NotPidfenceTable",
    "RestoredPastSink",
    "SchemaChanged",
    "StagedFileMissing",
    "TableGone",
    "VersionVacuumed",
]
