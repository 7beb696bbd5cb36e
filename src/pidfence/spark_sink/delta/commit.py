"""Exactly-once batch commits to a pidfence Delta table through Delta's own transaction ids.

Two roles, as in Spark's writer protocol:

* **executor** — :func:`stage_file` writes one (batch, topic, partition)'s rows as Parquet under
  ``_pidfence/staging/QUERY/BATCH/`` (hidden from Delta readers and VACUUM) and returns a
  :class:`StagedFile` (path, size, row count, column statistics) for the commit message. Names
  depend only on (query, batch, topic, partition) and the bytes only on the rows, so a re-run
  rewrites the same file.
* **driver** — :func:`commit_batch` moves the staged files to ``data/QUERY/BATCH/`` and adds
  them in ONE Delta commit carrying the transaction id (app id = query id, version = batch id),
  named in the history as Spark's Delta sink names its commits (``operationParameters``
  ``queryId`` and ``epochId``, plus ``userMetadata``). A batch whose id is at or below the
  table's transaction version for that query is already committed: the call is a no-op.

Other writers share the table (:mod:`history`): the commit lands on exactly the version it
checked (``max_commit_retries=0``); when another commit wins the race, it checks the new commits
and tries again. After a commit it writes a Delta checkpoint when one is due
(:mod:`checkpoints`).

A crash anywhere leaves either nothing of the batch in the table or all of it: files moved but
not added are invisible (Delta readers read only the files its log adds), and the re-run moves
the re-staged files over them and commits; after the Delta commit the re-run is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict, Unpack

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
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
from pidfence.spark_sink.delta.stats import file_stats, footer_stats
from pidfence.spark_sink.delta.table import (
    DATA_DIR,
    STAGING_DIR,
    WRITER,
    WRITER_KEY,
    Location,
    TableKind,
    cached_table,
    open_table,
    schema_of,
)
from pidfence.spark_sink.storage import write_parquet

#: Commit attempts before giving up with a (retriable) conflict: each lost race means another
#: writer's commit landed between the check and the commit.
MAX_ATTEMPTS: Final = 32

Hook = Callable[[str], None]


class CommitOptions(TypedDict, total=False):
    """The keyword options of :func:`commit_moves`, which documents each; :func:`commit_batch`
    passes them on."""

    storage_options: dict[str, str] | None
    info: dict[str, Any] | None
    hook: Hook | None


def _batch_name(batch_id: int) -> str:
    return f"{batch_id:020d}"


def file_name(topic: str, partition: int) -> str:
    """File name of one (topic, partition) in a batch.

    Only characters that need no escaping in a Delta path: a topic name is ``[a-zA-Z0-9._-]``
    (``~``, as in the manifest layout, is percent-encoded by some Delta writers and then not
    found). Nothing parses the name back: the rows carry their topic and partition.
    """
    return f"{topic}-{partition}.parquet"


def staging_dir(query_id: str, batch_id: int) -> str:
    """Directory (relative to the table root) of a batch's staged files."""
    return f"{STAGING_DIR}/{query_id}/{_batch_name(batch_id)}"


def data_dir(query_id: str, batch_id: int) -> str:
    """Directory (relative to the table root) of a batch's committed files."""
    return f"{DATA_DIR}/{query_id}/{_batch_name(batch_id)}"


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet file, as a task reports it to the driver."""

    name: str
    rows: int
    size: int
    stats: str

    def to_dict(self) -> dict[str, Any]:
        """Plain form (for commit messages that must pickle across versions)."""
        return {"name": self.name, "rows": self.rows, "size": self.size, "stats": self.stats}


def table_rows(rows: pa.Table, kind: TableKind) -> pa.Table:
    """``rows`` in the table's column order and types (other columns dropped)."""
    return rows.select(schema_of(kind).names).cast(schema_of(kind))


def stage_file(
    path: str,
    kind: TableKind,
    query_id: str,
    batch_id: int,
    topic: str,
    partition: int,
    rows: pa.Table,
    *,
    storage_options: dict[str, str] | None = None,
) -> StagedFile:
    """Executor side: write one partition's rows of a batch to the staging area.

    Args:
        path: the table root (the sink's ``path``, or ``rejectsPath`` for ``kind="rejects"``).
        rows: the rows, in the table's column order and types (cast here otherwise).
    """
    loc = Location.at(path, storage_options)
    table = table_rows(rows, kind)
    name = file_name(topic, partition)
    directory = loc.join(staging_dir(query_id, batch_id))
    loc.fs.create_dir(directory, recursive=True)
    target = f"{directory}/{name}"
    write_parquet(table, target, loc.fs)
    size = loc.fs.get_file_info(target).size
    return StagedFile(name, table.num_rows, int(size), file_stats(table))


@dataclass(frozen=True)
class Move:
    """A staged file to add: where it was staged and where it goes (relative to the root).

    ``stats`` is the Delta statistics JSON when the stager computed it; otherwise the commit
    reads it from the file's Parquet footer.
    """

    src: str
    dst: str
    stats: str | None = None


def _publish(loc: Location, query_id: str, batch_id: int, move: Move) -> AddAction:
    """Move a staged file into place (a re-run moves identical rows over it) and describe it."""
    src, dst = loc.join(move.src), loc.join(move.dst)
    if loc.fs.get_file_info(src).type == pafs.FileType.File:
        loc.fs.create_dir(dst.rpartition("/")[0], recursive=True)
        loc.fs.move(src, dst)
    info = loc.fs.get_file_info(dst)
    if info.type != pafs.FileType.File:
        raise StagedFileMissing(
            f"batch {batch_id} of query {query_id}: {move.src} is neither staged nor in place "
            f"at {move.dst} (removed by a cleanup?); nothing was committed. Re-run the batch."
        )
    mtime_ms = int(info.mtime_ns // 1_000_000) if info.mtime_ns is not None else 0
    stats = move.stats if move.stats is not None else footer_stats(loc, move.dst)
    return AddAction(move.dst, int(info.size), {}, mtime_ms, True, stats)


def committed_version(dt: DeltaTable, query_id: str) -> int | None:
    """The newest batch id committed for ``query_id`` (None when none is)."""
    return dt.transaction_version(query_id)


def is_committed(dt: DeltaTable, query_id: str, batch_id: int) -> bool:
    """Whether batch ``batch_id`` of ``query_id`` is in the table (batch ids only grow)."""
    version = committed_version(dt, query_id)
    return version is not None and version >= batch_id


def _drop_staging(loc: Location, query_id: str, batch_id: int) -> None:
    directory = loc.join(staging_dir(query_id, batch_id))
    if loc.fs.get_file_info(directory).type == pafs.FileType.Directory:
        loc.fs.delete_dir(directory)


def commit_batch(
    path: str,
    kind: TableKind,
    query_id: str,
    batch_id: int,
    files: Sequence[StagedFile],
    **options: Unpack[CommitOptions],
) -> bool:
    """Driver side: add the files :func:`stage_file` staged for a batch, in one Delta commit.

    See :func:`commit_moves` (this names the moves ``staging → data/QUERY/BATCH/``).
    """
    moves = [
        Move(
            f"{staging_dir(query_id, batch_id)}/{f.name}",
            f"{data_dir(query_id, batch_id)}/{f.name}",
            f.stats,
        )
        for f in files
    ]
    return commit_moves(path, kind, query_id, batch_id, moves, **options)


def commit_moves(
    path: str,
    kind: TableKind,
    query_id: str,
    batch_id: int,
    moves: Sequence[Move],
    *,
    storage_options: dict[str, str] | None = None,
    info: dict[str, Any] | None = None,
    hook: Hook | None = None,
) -> bool:
    """Driver side: move the batch's staged files into place and add them in one Delta commit.

    The commit carries ``Transaction(query_id, batch_id)``. Returns True if this call committed
    the batch, False if it was already committed (then nothing changes, and leftover staged
    files of the batch are removed).

    Args:
        info: extra commit info (e.g. per-partition counts), stored under ``pidfence.*`` keys.
        hook: called with ``"published"`` (files moved, not yet committed) and ``"committed"``
            (Delta commit done, staging not yet cleaned): the crash tests kill the process there.

    Raises:
        CannotContinue: the table's columns changed, a RESTORE went back before the sink's
            last batch, the table is gone, a constraint rejects the batch's rows, or the table
            needs a writer feature deltalake lacks (not retriable; the message says what to do).
        DeltaCommitConflict: other commits kept winning the race; nothing was committed
            (retriable).
        StagedFileMissing: a staged file is gone (retriable by re-running the whole batch).
        NotPidfenceTable: the path holds something else.
    """
    loc = Location.at(path, storage_options)
    try:
        dt = cached_table(path, kind, create=False, storage_options=storage_options)
    except TableNotFoundError as exc:
        raise TableGone(
            f"{loc.uri}: the Delta table the sink commits to is gone; batch {batch_id} cannot "
            "be committed. Restore the table from a backup, or start a new --output with a new "
            "--checkpoint"
        ) from exc
    extra = {f"pidfence.{k}": v for k, v in (info or {}).items()}
    for _attempt in range(MAX_ATTEMPTS):
        read_version = dt.version()
        check_log(loc, read_version)
        if is_committed(dt, query_id, batch_id):
            _drop_staging(loc, query_id, batch_id)
            return False
        check_shared(dt, kind, loc.uri, loc.uri)
        adds = [_publish(loc, query_id, batch_id, m) for m in moves]
        constraints = constraints_of(dt.metadata().configuration)
        if constraints:
            rows = _added_rows(loc, adds, kind)
            check_rows(rows, constraints, loc.uri, batch_id)
        if hook is not None:
            hook("published")
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
            if is_committed(dt, query_id, batch_id):
                # Another committer of this very batch won: it is in the table exactly once.
                _drop_staging(loc, query_id, batch_id)
                return False
            continue  # another writer's commit won: check what it did, then try again
        except DeltaProtocolError as exc:
            raise CannotContinue(
                f"{loc.uri}: deltalake cannot write to this table as it is now ({exc}); "
                f"nothing of batch {batch_id} was committed. Undo the table feature another "
                "engine enabled (see DESCRIBE HISTORY) and run again"
            ) from exc
        version = read_version + 1
        remember_own(loc.uri, version)
        if hook is not None:
            hook("committed")
        _drop_staging(loc, query_id, batch_id)
        maybe_checkpoint(dt, loc, version)
        return True
    raise DeltaCommitConflict(
        f"{loc.uri}: batch {batch_id} of query {query_id} lost {MAX_ATTEMPTS} commit races "
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


def check_log(loc: Location, version: int) -> None:
    """Raise :class:`TableGone` when the commit the table was read at is no longer there (its
    ``_delta_log`` was deleted): a commit now would start a broken table."""
    log = loc.join("_delta_log", f"{version:020d}")
    for suffix in (".json", ".checkpoint.parquet"):
        if loc.fs.get_file_info(log + suffix).type == pafs.FileType.File:
            return
    if loc.fs.get_file_info(loc.join("_delta_log")).type == pafs.FileType.Directory:
        return  # cleaned up behind a newer checkpoint: the table is there
    raise TableGone(
        f"{loc.uri}: the Delta table the sink commits to is gone (no _delta_log); its batches "
        "cannot continue. Restore the table from a backup, or start a new --output with a new "
        "--checkpoint"
    )


def _added_rows(loc: Location, adds: Sequence[AddAction], kind: TableKind) -> pa.Table:
    tables = [pq.read_table(loc.join(a.path), filesystem=loc.fs) for a in adds]
    if not tables:
        return schema_of(kind).empty_table()
    return pa.concat_tables(tables)


def abort_batch(
    path: str, query_id: str, batch_id: int, *, storage_options: dict[str, str] | None = None
) -> None:
    """Remove a batch's staged files (Spark's ``abort()``); committed data is never touched."""
    _drop_staging(Location.at(path, storage_options), query_id, batch_id)


def drop_stale_staging(
    path: str, kind: TableKind, query_id: str, *, storage_options: dict[str, str] | None = None
) -> list[int]:
    """Remove staged batches of ``query_id`` that are already committed; returns their ids.

    Staged batches above the committed version are kept: their commit may still come (a re-run
    rewrites them anyway).
    """
    loc = Location.at(path, storage_options)
    dt = open_table(path, kind, storage_options=storage_options)
    version = committed_version(dt, query_id)
    directory = loc.join(STAGING_DIR, query_id)
    infos = loc.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    dropped = []
    for info in infos:
        name = info.base_name
        if name.isdigit() and version is not None and int(name) <= version:
            loc.fs.delete_dir(info.path)
            dropped.append(int(name))
    return sorted(dropped)
