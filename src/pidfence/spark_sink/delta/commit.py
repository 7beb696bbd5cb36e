"""Exactly-once batch commits to a pidfence Delta table through Delta's own transaction ids.

Two roles, as in Spark's writer protocol:

* **executor** — :func:`stage_file` writes one (batch, topic, partition)'s rows as Parquet under
  ``_pidfence/staging/QUERY/BATCH/`` (hidden from Delta readers and VACUUM) and returns a
  :class:`StagedFile` (path, size, row count, column statistics) for the commit message. Names
  depend only on (query, batch, topic, partition) and the bytes only on the rows, so a re-run
  rewrites the same file.
* **driver** — :func:`commit_batch` moves the staged files to ``data/QUERY/BATCH/`` and adds
  them in ONE Delta commit carrying the transaction id (app id = query id, version = batch id).
  A batch whose id is at or below the table's transaction version for that query is already
  committed: the call is a no-op. The commit never retries over another writer's commit: any
  commit that landed since the table was read fails it with :class:`DeltaCommitConflict`
  (retriable: re-run the batch), except pure table care (``OPTIMIZE``, ``VACUUM``), which it
  commits over.

A crash anywhere leaves either nothing of the batch in the table or all of it: files moved but
not added are invisible (Delta readers read only the files its log adds), and the re-run moves
the re-staged files over them and commits; after the Delta commit the re-run is a no-op.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, PostCommitHookProperties

from pidfence.spark_sink.delta_table import (
    DATA_DIR,
    STAGING_DIR,
    WRITER,
    WRITER_KEY,
    DeltaCommitConflict,
    ForeignCommit,
    Location,
    StagedFileMissing,
    TableKind,
    cached_table,
    open_table,
    schema_of,
)
from pidfence.spark_sink.process import TS_TYPE
from pidfence.spark_sink.storage import write_parquet

#: Operations that change no rows; a sink commit may land after them.
CARE_OPERATIONS: Final = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
#: Columns without min/max statistics (Delta keeps none for binary columns).
NO_STATS: Final = frozenset({"key", "value", "pf"})
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
#: Commit attempts over concurrent table care before giving up with a conflict.
MAX_ATTEMPTS: Final = 8

Hook = Callable[[str], None]


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


def _stat(value: pa.Scalar, bound: str) -> Any:
    if pa.types.is_timestamp(value.type):
        # Delta keeps timestamp statistics in milliseconds: round outwards so they still bound.
        micros = int(value.cast(pa.int64()).as_py())
        millis = micros // 1000 if bound == "min" else -(-micros // 1000)
        stamp = pa.scalar(millis * 1000, pa.int64()).cast(TS_TYPE).as_py()
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"
    return value.as_py()


def file_stats(table: pa.Table) -> str:
    """Delta ``stats`` JSON of a file: record count, min/max and null counts.

    Every non-binary column gets bounds (strings in full, not truncated): deltalake's pyarrow
    dataset turns a missing bound into a guarantee that prunes the file from any filter on that
    column, so a reader filtering on it would silently miss rows.
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in table.column_names:
        if name in NO_STATS:
            continue
        col = table.column(name)
        nulls[name] = col.null_count
        if table.num_rows and col.null_count < table.num_rows:
            bounds = pc.min_max(col)
            mins[name] = _stat(bounds["min"], "min")
            maxs[name] = _stat(bounds["max"], "max")
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        sort_keys=True,
    )


def _bound(value: Any, bound: str) -> Any:
    if isinstance(value, datetime):
        micros = (value - _EPOCH) // timedelta(microseconds=1)
        return _stat(pa.scalar(micros, pa.int64()).cast(TS_TYPE), bound)
    return value


def footer_stats(loc: Location, rel: str) -> str:
    """Delta ``stats`` JSON of a Parquet file from its footer (no data read).

    Falls back to reading the file's non-binary columns when a row group has no statistics for
    one of them (a missing bound would hide the file from filtered reads, see
    :func:`file_stats`).
    """
    meta = pq.read_metadata(loc.join(rel), filesystem=loc.fs)
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in NO_STATS:
            continue
        count = 0
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(i).statistics
            if st is None or not st.has_null_count:
                table = pq.read_table(
                    loc.join(rel),
                    filesystem=loc.fs,
                    columns=[n for n in names if n not in NO_STATS],
                )
                return file_stats(table)
            count += st.null_count
            if st.has_min_max:
                lo, hi = _bound(st.min, "min"), _bound(st.max, "max")
                mins[name] = lo if name not in mins else min(mins[name], lo)
                maxs[name] = hi if name not in maxs else max(maxs[name], hi)
            elif st.null_count < meta.row_group(g).num_rows:
                table = pq.read_table(
                    loc.join(rel),
                    filesystem=loc.fs,
                    columns=[n for n in names if n not in NO_STATS],
                )
                return file_stats(table)
        nulls[name] = count
    return json.dumps(
        {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        sort_keys=True,
    )


def with_private_columns(rows: pa.Table, kind: TableKind, batch_id: int) -> pa.Table:
    """``rows`` in the table's column order and types; a rejects table gets ``batch`` (and a
    null ``pf`` when the rows have none)."""
    if kind == "rejects":
        if "pf" not in rows.column_names:
            rows = rows.append_column("pf", pa.nulls(rows.num_rows, pa.binary()))
        if "batch" not in rows.column_names:
            rows = rows.append_column("batch", pa.array([batch_id] * rows.num_rows, pa.int64()))
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
    table = with_private_columns(rows, kind, batch_id)
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


def _commits_since(dt: DeltaTable, version: int) -> list[dict[str, Any]]:
    """Commit infos of the versions after ``version`` (newest first)."""
    latest = dt.version()
    if latest <= version:
        return []
    return [c for c in dt.history(latest - version) if int(c.get("version", -1)) > version]


def _ours(commit: dict[str, Any]) -> bool:
    return commit.get(WRITER_KEY) == WRITER or commit.get("operation") in CARE_OPERATIONS


def check_no_foreign_commits(dt: DeltaTable, where: str) -> None:
    """Raise :class:`ForeignCommit` if a commit after pidfence's last batch changed data.

    Walks back from the newest commit to the newest commit pidfence made (normally the newest
    one, so this reads one commit file).
    """
    limit = 1
    while True:
        history = dt.history(limit)
        for commit in history:
            if commit.get(WRITER_KEY) == WRITER:
                return
            if commit.get("operation") not in CARE_OPERATIONS:
                raise ForeignCommit(
                    f"{where}: version {commit.get('version')} ({commit.get('operation')}, "
                    f"by {commit.get('engineInfo', 'an unknown engine')}) was not written by "
                    "pidfence; refusing to append to a table another writer changes"
                )
        if len(history) < limit:
            return
        limit *= 8


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
    *,
    storage_options: dict[str, str] | None = None,
    info: dict[str, Any] | None = None,
    hook: Hook | None = None,
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
    return commit_moves(
        path,
        kind,
        query_id,
        batch_id,
        moves,
        storage_options=storage_options,
        info=info,
        hook=hook,
    )


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
        DeltaCommitConflict: another commit landed meanwhile and it was not table care;
            nothing was committed (retriable).
        ForeignCommit: another writer changed the table's data since pidfence's last batch.
        StagedFileMissing: a staged file is gone (retriable by re-running the whole batch).
        NotPidfenceTable: the path holds something else.
    """
    loc = Location.at(path, storage_options)
    dt = cached_table(path, kind, storage_options=storage_options)
    schema = schema_of(kind)
    extra = {f"pidfence.{k}": v for k, v in (info or {}).items()}
    for _attempt in range(MAX_ATTEMPTS):
        read_version = dt.version()
        if is_committed(dt, query_id, batch_id):
            _drop_staging(loc, query_id, batch_id)
            return False
        check_no_foreign_commits(dt, loc.uri)
        adds = [_publish(loc, query_id, batch_id, m) for m in moves]
        if hook is not None:
            hook("published")
        props = CommitProperties(
            custom_metadata={
                WRITER_KEY: WRITER,
                "pidfence.query": query_id,
                "pidfence.batch": batch_id,
                **extra,
            },
            max_commit_retries=0,
            app_transactions=[Transaction(query_id, batch_id, int(time.time() * 1000))],
        )
        try:
            dt.create_write_transaction(
                list(adds),
                "append",
                schema,
                commit_properties=props,
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True),
            )
        except CommitFailedError as exc:
            dt.update_incremental()
            if is_committed(dt, query_id, batch_id):
                # Another committer of this very batch won: it is in the table exactly once.
                _drop_staging(loc, query_id, batch_id)
                return False
            others = [c for c in _commits_since(dt, read_version) if not _ours(c)]
            if others or not _commits_since(dt, read_version):
                first = others[-1] if others else {}
                raise DeltaCommitConflict(
                    f"{loc.uri}: batch {batch_id} of query {query_id} lost a commit race "
                    f"against version {first.get('version', '?')} "
                    f"({first.get('operation', exc)}); nothing was committed, re-run the batch"
                ) from exc
            continue
        if hook is not None:
            hook("committed")
        _drop_staging(loc, query_id, batch_id)
        return True
    raise DeltaCommitConflict(
        f"{loc.uri}: batch {batch_id} of query {query_id} lost {MAX_ATTEMPTS} commit races "
        "against table care; nothing was committed, re-run the batch"
    )


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
