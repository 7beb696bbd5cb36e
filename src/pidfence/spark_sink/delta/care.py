"""Table care of the pidfence Delta tables: compaction, vacuum, log checkpoints.

None of these touches a file of an uncommitted batch (its tasks write it straight to
``data/QUERY/BATCH/``, and the batch's commit adds it): compaction rewrites only files the Delta
log adds, the default (lite) vacuum deletes only files the log removed, and the full vacuum,
which also deletes files no commit ever added, keeps every file of a batch its query has not
committed yet.

Checkpoints of the Delta log are written after the sink's commits at the table's
``delta.checkpointInterval`` (Delta Lake's default, 10: :mod:`checkpoints`); :func:`checkpoint`
writes one now. Other engines may do any of this too, while the sink runs.
"""

from __future__ import annotations

import re
from typing import Any, Final

from deltalake.exceptions import DeltaError

from pidfence.spark_sink.delta.commit import committed_version
from pidfence.spark_sink.delta.errors import (
    DataFileMissing,
    DeltaTableError,
    NotPidfenceTable,
    VersionVacuumed,
)
from pidfence.spark_sink.delta.table import (
    DATA_DIR,
    TableKind,
    holds_delta,
    marker,
    open_table,
)
from pidfence.spark_sink.options import rejects_path_of
from pidfence.spark_sink.storage import Store

#: How deltalake names a file the store does not have (local and object stores alike).
_NOT_FOUND: Final = re.compile(r"Object at location (\S+) not found")


def compact(
    path: str,
    kind: TableKind = "log",
    *,
    target_size: int | None = None,
) -> dict[str, Any]:
    """Rewrite small committed files into files of about ``target_size`` bytes.

    A ``dataChange=false`` commit: readers see the same rows; the replaced files stay until a
    vacuum past the retention period. Returns deltalake's metrics (``numFilesAdded``,
    ``numFilesRemoved`` …).
    """
    dt = open_table(path, kind, create=False)
    try:
        return dt.optimize.compact(target_size=target_size, commit_properties=marker())
    except (DeltaError, OSError) as exc:
        named = _missing_file(path, kind, exc)
        if named is None:
            raise
        raise named from exc


def _missing_file(path: str, kind: TableKind, exc: BaseException) -> DeltaTableError | None:
    """What a read of the table that met a missing file (``exc``) met, None for any other
    error: :class:`DataFileMissing` when the table's current version still adds the file,
    :class:`VersionVacuumed` when a newer version removed it and a vacuum deleted it since."""
    found = _NOT_FOUND.search(str(exc))
    if found is None:
        return None
    missing = found.group(1)
    table = Store.at(path)
    now = open_table(path, kind, create=False)
    for uri in now.file_uris():
        rel = _relative(table, uri)
        if missing == rel or missing.endswith("/" + rel):
            return DataFileMissing.at(table.uri, now.version(), rel)
    return VersionVacuumed(
        f"{table.uri}: {missing} was removed by a newer commit and vacuumed while this ran; "
        "nothing was committed; run it again, it continues"
    )


def _relative(table: Store, uri: str) -> str:
    for prefix in (table.uri.rstrip("/") + "/", "file://" + table.root.rstrip("/") + "/"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri


def _uncommitted(rel: str, versions: dict[str, int | None]) -> bool:
    """Whether ``rel`` is a file of a batch that its query has not committed."""
    parts = rel.split("/")
    if len(parts) != 4 or parts[0] != DATA_DIR or not parts[2].isdigit():
        return False
    committed = versions.get(parts[1])
    return committed is None or int(parts[2]) > committed


def vacuum(
    path: str,
    kind: TableKind = "log",
    *,
    retention_hours: int | None = None,
    full: bool = False,
    dry_run: bool = False,
    enforce_retention: bool = True,
) -> list[str]:
    """Delete files the table no longer needs; returns them (relative to the table root).

    Args:
        retention_hours: keep removed files this long (default: the table's
            ``delta.deletedFileRetentionDuration``, 7 days), so readers of older versions and
            running queries keep working.
        full: also delete files no commit references (leftovers of batches that crashed and were
            re-run into other files), except files of batches not committed yet.
        dry_run: only list.
        enforce_retention: refuse a retention below the table's minimum (deltalake's check).
    """
    table = Store.at(path)
    dt = open_table(path, kind, create=False)
    if not full:
        found = dt.vacuum(
            retention_hours,
            dry_run=dry_run,
            enforce_retention_duration=enforce_retention,
            commit_properties=marker(),
            full=False,
        )
        return sorted(_relative(table, f) for f in found)
    candidates = dt.vacuum(
        retention_hours, dry_run=True, enforce_retention_duration=enforce_retention, full=True
    )
    queries = {
        rel.split("/")[1]
        for rel in (_relative(table, c) for c in candidates)
        if rel.startswith(DATA_DIR + "/") and rel.count("/") == 3
    }
    versions = {q: committed_version(dt, q) for q in queries}
    doomed = sorted(
        rel for rel in (_relative(table, c) for c in candidates) if not _uncommitted(rel, versions)
    )
    if not dry_run:
        for rel in doomed:
            table.delete(table.join(rel))
        table.drop_empty_dirs_below(table.join(DATA_DIR))
    return doomed


def checkpoint(path: str, kind: TableKind = "log") -> int:
    """Write a Delta log checkpoint at the current version now; returns that version."""
    dt = open_table(path, kind, create=False)
    dt.create_checkpoint()
    return dt.version()


def tables_of(path: str, rejects_path: str | None = None) -> list[tuple[TableKind, str]]:
    """``(kind, root)`` of an output's Delta tables: the log, and the rejects once they exist.

    Raises:
        NotPidfenceTable: ``path`` holds no Delta table.
    """
    path = path.rstrip("/")
    rejects = rejects_path_of(path, rejects_path)
    if not holds_delta(path):
        raise NotPidfenceTable(f"{path} holds no Delta table: is it the sink's --output?")
    tables: list[tuple[TableKind, str]] = [("log", path)]
    if holds_delta(rejects):
        tables.append(("rejects", rejects))
    return tables
