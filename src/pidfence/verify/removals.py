"""Whether a row the sink wrote may have been removed on purpose: the Delta table's history.

A row of the sink's own account (``read_written``) that the table no longer holds is ``deleted``
(information) only when the table's history holds, after the sink's commit of that row's batch,
a commit that can remove rows: a DELETE, MERGE, UPDATE, RESTORE, TRUNCATE, a replacing CREATE/
REPLACE TABLE, an overwriting WRITE (``mode`` Overwrite, ``replaceWhere`` included) or a
streaming write in Complete mode. Table care does not remove rows (OPTIMIZE, z-order, VACUUM,
checkpoints, properties, columns), and neither does ``FSCK REPAIR TABLE``: it drops the entries
of data files that are gone, which is a loss, not a delete. Without such a commit the row is
``lost``: a data file gone, a commit the sink never made, whatever removed it without an
operation that removes rows. A row still in place whose value differs from what was sent is
``updated`` (information) on the same condition (:class:`Changes`).

Limit: Delta keeps history only for the table's ``delta.logRetentionDuration`` (the sink creates
its tables with 1 hour; raise it, say ``interval 30 days``, on an output users delete from): a
removing commit older than the retained history is not seen, so its rows read as ``lost`` until
they are accounted for. pidfence's own commits (marked ``pidfence.writer``) never remove rows
and are never taken as a removal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pyarrow as pa

    from pidfence.ledger import LedgerEntry

#: Operation names (Delta protocol commitInfo ``operation``, Spark's and delta-rs') that may
#: remove rows whatever their parameters.
REMOVING: Final = frozenset(
    {
        "DELETE",
        "MERGE",
        "UPDATE",
        "RESTORE",
        "TRUNCATE",
        "CREATE OR REPLACE TABLE",
        "CREATE OR REPLACE TABLE AS SELECT",
        "REPLACE TABLE",
        "REPLACE TABLE AS SELECT",
    }
)
#: Operations that remove rows when they overwrite (``mode`` Overwrite / ``outputMode`` Complete).
OVERWRITING: Final = frozenset(
    {"WRITE", "STREAMING UPDATE", "CREATE TABLE AS SELECT", "CREATE TABLE", "COPY INTO"}
)
#: Where the sink put a row: a log row's batch in the sink's account is found by it.
PLACE: Final = ("topic", "partition", "log_offset")
_WRITER_KEY: Final = "pidfence.writer"  # pidfence.spark_sink.delta.table.WRITER_KEY
_BATCH_KEY: Final = "pidfence.batch"  # pidfence.spark_sink.delta.history.BATCH_KEY


def removes_rows(commit: Mapping[str, Any]) -> bool:
    """Whether a history entry (``DeltaTable.history()``) is an operation that can remove rows."""
    if commit.get(_WRITER_KEY) is not None:
        return False
    operation = str(commit.get("operation") or "").upper()
    if operation in REMOVING:
        return True
    if operation not in OVERWRITING:
        return False
    params = commit.get("operationParameters") or {}
    mode = str(params.get("mode") or params.get("outputMode") or "").strip('"').lower()
    return mode in ("overwrite", "complete") or bool(params.get("replaceWhere"))


class Removals:
    """The table's history, asked whether a batch's rows may have been removed since.

    Args:
        history: ``DeltaTable.history()`` entries of the log table (any order).
    """

    def __init__(self, history: Iterable[Mapping[str, Any]]) -> None:
        self.batches: dict[int, int] = {}
        self.removing: list[tuple[int, str]] = []
        #: The oldest version the history still holds (0: the whole history).
        self.oldest = -1
        for commit in history:
            version = int(commit["version"])
            self.oldest = version if self.oldest < 0 else min(self.oldest, version)
            batch = commit.get(_BATCH_KEY)
            if batch is not None and commit.get(_WRITER_KEY) is not None:
                key = int(batch)
                self.batches[key] = max(version, self.batches.get(key, -1))
            elif removes_rows(commit):
                self.removing.append((version, str(commit.get("operation"))))
        self.removing.sort()

    def after(self, batch: int | None) -> tuple[int, str] | None:
        """The first removing commit after the commit of ``batch`` (None: there is none).

        A batch whose commit the retained history no longer holds (or ``batch`` None: not
        known) was committed before every retained commit, so any removing commit retained is
        after it; when the history is whole (it starts at version 0) and holds no commit of
        ``batch``, the batch was never committed and nothing excuses its rows.
        """
        since = self.batches.get(batch) if batch is not None else None
        if since is None:
            if batch is not None and self.oldest == 0:
                return None
            since = -1
        return next((c for c in self.removing if c[0] > since), None)


class Changes:
    """Which of the sink's rows another writer changed in place (an UPDATE, a MERGE): a row of
    its account whose value differs from every acknowledged send of its identity, after a
    commit that rewrites rows followed the sink's commit of its batch."""

    def __init__(self, removals: Removals, written: pa.Table) -> None:
        self._removals = removals
        places = zip(*(written.column(c).to_pylist() for c in PLACE), strict=True)
        batches = (
            written.column("batch").to_pylist()
            if "batch" in written.column_names
            else [None] * written.num_rows
        )
        self._batch: dict[tuple[Any, ...], int | None] = dict(zip(places, batches, strict=True))

    def of(
        self, row: Mapping[str, Any], sent: Mapping[tuple[int, str], LedgerEntry]
    ) -> tuple[str, str] | None:
        """(the digest the sink wrote, the commit that changed it), or None: not a change."""
        place = tuple(row[c] for c in PLACE)
        if place not in self._batch:
            return None
        written = {d for g, d in sent if g == row["generation"]}
        if len(written) != 1:
            return None  # no send of its generation, or several: not told apart
        by = self._removals.after(self._batch[place])
        return None if by is None else (written.pop(), f"version {by[0]} ({by[1]})")


__all__ = ["OVERWRITING", "PLACE", "REMOVING", "Changes", "Removals", "removes_rows"]
