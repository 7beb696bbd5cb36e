"""Exactly-once batch commits to a pidfence Delta table through Delta's own transaction ids.

The driver's :func:`commit_files` adds a batch's data files (written by its tasks under
``data/QUERY/BATCH/``, invisible to Delta readers until added) in ONE Delta commit carrying the
transaction id (app id = query id, version = batch id), named in the history as Spark's Delta sink
names its commits (``operationParameters`` ``queryId`` and ``epochId``, plus ``userMetadata``). A
batch whose id is at or below the table's transaction version for that query is already
committed: the call is a no-op.

Other writers share the table (:mod:`history`): the commit lands on exactly the version it
checked (``max_commit_retries=0``); when another commit wins the race, it checks the new commits
and tries again. After a commit it writes a Delta checkpoint when one is due
(:mod:`checkpoints`).

A crash anywhere leaves either nothing of the batch in the table or all of it: files written but
not added are invisible, and after the Delta commit a re-run is a no-op.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, DeltaProtocolError, TableNotFoundError
from deltalake.transaction import AddAction, PostCommitHookProperties

from pidfence.spark_sink.delta.checkpoints import maybe_checkpoint
from pidfence.spark_sink.delta.constraints import check_rows, constraints_of
from pidfence.spark_sink.delta.errors import (
    CannotContinue,
    DeltaCommitConflict,
    StagedFileMissing,
    TableGone,
)
from pidfence.spark_sink.delta.history import BATCH_KEY, QUERY_KEY, check_shared, remember_own
from pidfence.spark_sink.delta.stats import footer_stats
from pidfence.spark_sink.delta.table import WRITER, WRITER_KEY, TableKind, cached_table, schema_of
from pidfence.spark_sink.storage import Store

#: Commit attempts before giving up with a (retriable) conflict: each lost race means another
#: writer's commit landed between the check and the commit.
MAX_ATTEMPTS: Final = 32

Hook = Callable[[str], None]


def table_rows(rows: pa.Table, kind: TableKind) -> pa.Table:
    """``rows`` in the table's column order and types (other columns dropped)."""
    return rows.select(schema_of(kind).names).cast(schema_of(kind))


def _added(table: Store, query_id: str, batch_id: int, rel: str, stats: str | None) -> AddAction:
    """The Delta add action of one of the batch's files."""
    found = table.stat(table.join(rel))
    if found is None:
        raise StagedFileMissing(
            f"batch {batch_id} of query {query_id}: its file {rel} is gone (removed by a "
            "cleanup?); nothing was committed. Re-run the batch."
        )
    stats = stats if stats is not None else footer_stats(table, rel)
    return AddAction(rel, found.size, {}, found.mtime_ns // 1_000_000, True, stats)


def _adds(
    table: Store, query_id: str, batch_id: int, files: Sequence[tuple[str, str | None]]
) -> list[AddAction]:
    """The batch's add actions. On an object store each file's look-up is a round trip: they
    go side by side, so a batch waits for one rather than one per file."""
    if table.local or len(files) < 2:
        return [_added(table, query_id, batch_id, rel, stats) for rel, stats in files]
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        return list(pool.map(lambda f: _added(table, query_id, batch_id, *f), files))


def committed_version(dt: DeltaTable, query_id: str) -> int | None:
    """The newest batch id committed for ``query_id`` (None when none is)."""
    return dt.transaction_version(query_id)


def _is_committed(dt: DeltaTable, query_id: str, batch_id: int) -> bool:
    """Whether batch ``batch_id`` of ``query_id`` is in the table (batch ids only grow)."""
    version = committed_version(dt, query_id)
    return version is not None and version >= batch_id


def commit_files(
    table: Store,
    kind: TableKind,
    query_id: str,
    batch_id: int,
    files: Sequence[tuple[str, str | None]],
    *,
    info: dict[str, Any] | None = None,
    hook: Hook | None = None,
) -> bool:
    """Driver side: add the batch's files to the table at ``table`` in one Delta commit.

    The commit carries ``Transaction(query_id, batch_id)``. Returns True if this call committed
    the batch, False if it was already committed (then nothing changes).

    Args:
        files: ``(path relative to the table root, Delta stats JSON or None)`` of each file;
            without stats they are read from the file's Parquet footer.
        info: extra commit info (e.g. per-partition counts), stored under ``pidfence.*`` keys.
        hook: called with ``"checked"`` (files checked, not yet committed) and ``"committed"``
            (Delta commit done): the crash tests kill the process there.

    Raises:
        CannotContinue: the table's columns changed, a RESTORE went back before the sink's
            last batch, the table is gone, a constraint rejects the batch's rows, or the table
            needs a writer feature deltalake lacks (not retriable; the message says what to do).
        DeltaCommitConflict: other commits kept winning the race; nothing was committed
            (retriable).
        StagedFileMissing: a file of the batch is gone (retriable by re-running the batch).
        NotPidfenceTable: the path holds something else.
    """
    try:
        dt = cached_table(table.uri, kind, create=False)
    except TableNotFoundError as exc:
        raise TableGone(
            f"{table.uri}: the Delta table the sink commits to is gone; batch {batch_id} cannot "
            "be committed. Restore the table from a backup, or start a new --output with a new "
            "--checkpoint"
        ) from exc
    extra = {f"pidfence.{k}": v for k, v in (info or {}).items()}
    for _attempt in range(MAX_ATTEMPTS):
        read_version = dt.version()
        check_log(table, read_version)
        if _is_committed(dt, query_id, batch_id):
            return False
        check_shared(dt, kind, table.uri, table.uri)
        adds = _adds(table, query_id, batch_id, files)
        constraints = constraints_of(dt.metadata().configuration)
        if constraints:
            rows = _added_rows(table, adds, kind)
            check_rows(rows, constraints, table.uri, batch_id)
        if hook is not None:
            hook("checked")
        try:
            dt.create_write_transaction(
                list(adds),
                "append",
                schema_of(kind),
                commit_properties=_properties(query_id, batch_id, extra),
                post_commithook_properties=PostCommitHookProperties(
                    create_checkpoint=False, cleanup_expired_logs=False
                ),
            )
        except CommitFailedError:
            dt.update_incremental()
            if _is_committed(dt, query_id, batch_id):
                # Another committer of this very batch won: it is in the table exactly once.
                return False
            continue  # another writer's commit won: check what it did, then try again
        except DeltaProtocolError as exc:
            raise CannotContinue(
                f"{table.uri}: deltalake cannot write to this table as it is now ({exc}); "
                f"nothing of batch {batch_id} was committed. Undo the table feature another "
                "engine enabled (see DESCRIBE HISTORY) and run again"
            ) from exc
        version = read_version + 1
        remember_own(table.uri, version)
        if hook is not None:
            hook("committed")
        maybe_checkpoint(dt, table, version)
        return True
    raise DeltaCommitConflict(
        f"{table.uri}: batch {batch_id} of query {query_id} lost {MAX_ATTEMPTS} commit races "
        "against other writers' commits; nothing was committed, re-run the batch"
    )


def _properties(query_id: str, batch_id: int, extra: dict[str, Any]) -> CommitProperties:
    """Commit info that names the query and batch as Spark's Delta sink does, the sink's
    marker, and the transaction id that makes the commit exactly once."""
    return CommitProperties(
        custom_metadata={
            WRITER_KEY: WRITER,
            QUERY_KEY: query_id,
            BATCH_KEY: batch_id,
            **extra,
            "operationParameters": {
                "outputMode": "Append",
                "queryId": query_id,
                "epochId": str(batch_id),
            },
            "userMetadata": f"pidfence-sink query {query_id} batch {batch_id}",
            "isBlindAppend": True,
        },
        max_commit_retries=0,
        app_transactions=[Transaction(query_id, batch_id, int(time.time() * 1000))],
    )


#: A Delta commit's or checkpoint's file name: its version in 20 digits first.
_COMMIT = re.compile(r"\d{20}\.(?:json|checkpoint(?:\.\d+\.\d+)?\.parquet)")


def check_log(table: Store, version: int) -> None:
    """Raise :class:`TableGone` when the commit the table was read at is no longer there (its
    ``_delta_log`` was deleted, or the table deleted and created again, its log now ending
    before that version): a commit now would start a broken table, or land in another one."""
    log = table.join("_delta_log", f"{version:020d}")
    if any(table.exists(log + suffix) for suffix in (".json", ".checkpoint.parquet")):
        return
    commits = [int(n[:20]) for n in table.list(table.join("_delta_log")) if _COMMIT.fullmatch(n)]
    if commits and max(commits) >= version:
        return  # cleaned up behind a newer checkpoint: the table is there
    if commits:
        raise TableGone(
            f"{table.uri}: the Delta table the sink commits to was deleted and created again (its "
            f"log ends at version {max(commits)}, the sink read it at version {version}); its "
            "batches cannot continue there. Restore the table from a backup, or start a new "
            "--output with a new --checkpoint"
        )
    raise TableGone(
        f"{table.uri}: the Delta table the sink commits to is gone (no _delta_log); its batches "
        "cannot continue. Restore the table from a backup, or start a new --output with a new "
        "--checkpoint"
    )


def _added_rows(table: Store, adds: Sequence[AddAction], kind: TableKind) -> pa.Table:
    tables = [table.read_table(table.join(a.path)) for a in adds]
    if not tables:
        return schema_of(kind).empty_table()
    return pa.concat_tables(tables)
