"""The sink's :class:`~pidfence.spark_sink.layout.BatchLayout` over Delta Lake tables.

The output log ``P`` and the rejects log ``R`` are pidfence Delta tables (:mod:`delta_table`);
everything else the commit protocol keeps is pidfence's own and lives under ``P/_pidfence/``
(``R/_pidfence/`` for staged rejects), which Delta readers and ``VACUUM`` never look at::

    P/_pidfence/data/BATCH/TOPIC~PART.TAG.parquet   staged log files (one per task attempt)
    R/_pidfence/BATCH/TOPIC~PART.TAG.parquet        staged rejects
    P/_pidfence/_held/BATCH/…                       records held for reordering (committed with
                                                    the batch, read only by the sink)
    P/_pidfence/_decided/BATCH/…                    what the batch decided per record, by
                                                    identity only (the sink's own account)
    P/_pidfence/_manifests/BATCH.json, _index/      the batch's manifest, the positions index
    P/_pidfence/_state/…, _owner.json               producer state, the owner record

**The commit point is the Delta commit of the log table** carrying the transaction id (query id,
batch id). :meth:`DeltaLayout.publish` writes the manifest (overwritable: it counts only once the
Delta commit lands), commits the rejects table, then the log table, each through
:func:`~pidfence.spark_sink.delta_commit.commit_moves` (move ``_pidfence/…`` →
``data/QUERY/BATCH/TOPIC-PART.TAG.parquet``, one commit with the transaction id). A batch is
committed when the log table's transaction version for the query is at or above it; only then
does :meth:`committed` return its manifest. A crash between the two commits leaves the batch's
rejects committed and its log not: the re-run's rejects commit is a no-op (same transaction id)
and the log commit lands.

The sink never reads the tables' rows back: other writers append to them, OPTIMIZE rewrites
them, users DELETE from them. Producer state derives from the batches' decisions files
(:mod:`pidfence.spark_sink.decisions`), which only the sink writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any, Final

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from pidfence.spark_sink.decisions import decided_rows
from pidfence.spark_sink.delta.commit import Move, check_log, commit_moves, data_dir, table_rows
from pidfence.spark_sink.delta.errors import DeltaTableError, TableGone
from pidfence.spark_sink.delta.stats import file_stats
from pidfence.spark_sink.delta.table import (
    OWN_DIR,
    Location,
    TableKind,
    cached_table,
    check_path,
    check_table,
)
from pidfence.spark_sink.errors import SinkError
from pidfence.spark_sink.faults import crash_point
from pidfence.spark_sink.layout import ParquetLayout, PartAttempt, PartFiles, part_file
from pidfence.spark_sink.storage import manifest_ids, manifest_path
from pidfence.wire import PidfenceError

#: (log path, rejects path) of the layouts this process opened.
_OPENED: set[tuple[str, str]] = set()
#: How a staged name ``TOPIC~PART.TAG.parquet`` is named in ``data/``: ``~`` is percent-encoded
#: by some Delta writers (compaction then cannot find the file).
_SEPARATOR: Final = "-"


def _join(path: str, *parts: str) -> str:
    return "/".join((path.rstrip("/"), *parts))


class DeltaLayout(ParquetLayout):
    """The Delta Lake layout of the sink's output (``tableFormat=delta``).

    Args:
        path: the sink's ``path`` (the log table's root).
        rejects_path: the sink's ``rejectsPath`` (the rejects table's root).
        query_id: the streaming query's id: the Delta transaction ids' app id.
        storage_options: deltalake storage options for object stores (credentials, endpoint).
    """

    #: Delta's own default codec (delta-rs and Spark write snappy): a quarter cheaper to write
    #: than zstd (``bench/sink_task_cost.py``), files somewhat larger.
    compression: str = "snappy"

    def __init__(
        self,
        path: str,
        rejects_path: str,
        query_id: str,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        super().__init__(_join(path, OWN_DIR), _join(rejects_path, OWN_DIR))
        self.path = path
        self.rejects_path = rejects_path
        self.query_id = query_id
        self.storage_options = storage_options
        self._version: int | None = None
        self._tables: dict[str, DeltaTable] = {}

    # ----------------------------------------------------------------------------- tables

    def open(self, committed_before: bool = False) -> None:
        """Create-or-open both tables (driver, at query start): refuses a non-pidfence table
        at either path before anything is written at either.

        Args:
            committed_before: the query's checkpoint says it committed batches already.

        Raises:
            TableGone: a table is missing although batches were committed to it (its manifests
                or the checkpoint say so): creating an empty one would hide the loss.
        """
        key = (self.path, self.rejects_path)
        if key in _OPENED and self._reopen():
            return
        found = [
            check_path(self.path, "log", self.storage_options),
            check_path(self.rejects_path, "rejects", self.storage_options),
        ]
        if not all(found) and (committed_before or manifest_ids(self.store)):
            missing = self.path if not found[0] else self.rejects_path
            raise TableGone(
                f"{missing}: the sink committed batches to a Delta table here, and it is gone "
                "(deleted, or its _delta_log removed). Restore it from a backup, or start a new "
                "--output with a new --checkpoint"
            )
        self._table("rejects")
        self._table("log")
        _OPENED.add(key)

    def _reopen(self) -> bool:
        """Open both tables again in a process that opened them before (Spark builds a writer
        for every batch, in the driver and in the commit process): bring the kept tables up
        to date and check them as a fresh open would, without replaying their logs. False when
        anything looks different (then the fresh open decides)."""
        tables: dict[str, DeltaTable] = {}
        kinds: tuple[TableKind, TableKind] = ("rejects", "log")
        try:
            for kind in kinds:
                path = self.rejects_path if kind == "rejects" else self.path
                dt = cached_table(path, kind, create=False, storage_options=self.storage_options)
                loc = Location.at(path, self.storage_options)
                check_table(dt, kind, loc.uri)
                # A kept table whose log was deleted still answers from memory.
                check_log(loc, dt.version())
                tables[kind] = dt
        except (PidfenceError, DeltaError, OSError):
            return False
        self._tables.update(tables)
        return True

    def _table(self, kind: TableKind, create: bool = True) -> DeltaTable:
        if kind not in self._tables:
            path = self.rejects_path if kind == "rejects" else self.path
            self._tables[kind] = cached_table(
                path, kind, create=create, storage_options=self.storage_options
            )
        return self._tables[kind]

    def committed_version(self) -> int:
        """The newest batch id committed for this query (-1 when none), cached per instance."""
        if self._version is None:
            try:
                version = self._table("log", create=False).transaction_version(self.query_id)
            except TableNotFoundError:
                version = None
            self._version = -1 if version is None else version
        return self._version

    # ----------------------------------------------------------------------------- lookups

    def committed(self, batch_id: int) -> dict[str, Any] | None:
        """The batch's manifest if the log table's transaction id says it is committed."""
        if batch_id > self.committed_version():
            return None
        manifest = super().committed(batch_id)
        if manifest is None:
            raise DeltaTableError(
                f"{self.path}: batch {batch_id} is committed in the Delta log but its manifest "
                f"{manifest_path(self.store, batch_id)} is missing; pidfence's _pidfence/ "
                "directory was damaged"
            )
        return manifest

    def last_committed_before(self, batch_id: int) -> int | None:
        """The newest committed batch below ``batch_id`` (manifests beyond the Delta
        transaction version belong to attempts that never committed)."""
        top = min(batch_id - 1, self.committed_version())
        ids = [b for b in manifest_ids(self.store) if b <= top]
        return ids[-1] if ids else None

    def committed_ids(self) -> list[int]:
        """Every batch this query committed to the log table, ascending (re-reads the table's
        transaction version: a manifest above it belongs to an attempt that never committed)."""
        self._version = None
        self._tables.pop("log", None)
        top = self.committed_version()
        return [b for b in manifest_ids(self.store) if b <= top]

    # ----------------------------------------------------------------------------- writing

    def stage_part(self, part: PartAttempt, tables: dict[str, pa.Table]) -> PartFiles:
        """Stage under ``_pidfence/`` (invisible to Delta), with the part's decisions."""
        staged = dict(tables)
        log, rejects = staged.get("log"), staged.get("rejects")
        staged["decided"] = decided_rows(log, rejects)
        if rejects is not None and rejects.num_rows:
            staged["rejects"] = table_rows(rejects, "rejects")
        if log is not None and log.num_rows:
            staged["log"] = table_rows(log, "log")
        files = super().stage_part(part, staged)
        # The commit adds the files with these statistics (taken here, in parallel tasks,
        # rather than from each file's footer on the driver).
        stats = {k: file_stats(staged[k]) for k in ("log", "rejects") if getattr(files, k)}
        return dataclasses.replace(files, stats=stats)

    def publish(self, batch_id: int, manifest: dict[str, Any]) -> bool:
        """Write the manifest, commit the rejects table, then the log table (the commit point).

        Returns False when the batch was already committed (nothing changes then).
        """
        if self.committed(batch_id) is not None:
            return False
        self.store.write_bytes(manifest_path(self.store, batch_id), _manifest_bytes(manifest))
        info = {"parts": len(manifest["parts"])}
        done = False
        kinds: tuple[TableKind, TableKind] = ("rejects", "log")
        for kind in kinds:
            moves = [
                self._move(kind, batch_id, rel, (part.get("stats") or {}).get(kind))
                for part in manifest["parts"]
                if (rel := part_file(batch_id, part, kind)) is not None
            ]
            path = self.rejects_path if kind == "rejects" else self.path
            done = commit_moves(
                path,
                kind,
                self.query_id,
                batch_id,
                moves,
                storage_options=self.storage_options,
                info=info,
            )
            self._tables.pop(kind, None)
            if not done:
                # Committed by an earlier attempt (a crash between the two commits): this
                # attempt's identical staged files are never needed.
                self._drop_sources(path, moves)
            if kind == "rejects":
                crash_point("rejects_committed")
        self._version = None
        return done

    def _drop_sources(self, path: str, moves: list[Move]) -> None:
        loc = Location.at(path, self.storage_options)
        for move in moves:
            with contextlib.suppress(FileNotFoundError):
                loc.fs.delete_file(loc.join(move.src))

    def _move(self, kind: str, batch_id: int, rel: str, stats: str | None) -> Move:
        name = rel.rpartition("/")[2].replace("~", _SEPARATOR)
        return Move(f"{OWN_DIR}/{rel}", f"{data_dir(self.query_id, batch_id)}/{name}", stats)

    # ----------------------------------------------------------------------------- reading

    def read_decided(self, batch_id: int, part: dict[str, Any]) -> pa.Table | None:
        """What a committed part decided: its decisions file, written for every part that
        decided a record (None: the part only held records, or read none)."""
        if part_file(batch_id, part, "decided") is None:
            return None
        return self.read_part(batch_id, part, "decided")

    def read_part(self, batch_id: int, part: dict[str, Any], kind: str) -> pa.Table | None:
        """A committed part's held records or decisions (pidfence's own files).

        The tables' rows are the users' (others append, OPTIMIZE, DELETE): read them with the
        readers, never back into the sink.
        """
        if kind in ("log", "rejects"):
            raise SinkError(
                f"the Delta layout does not read {kind} rows back; use the part's decisions"
            )
        return super().read_part(batch_id, part, kind)


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, indent=1).encode()


def open_layout(
    path: str,
    rejects_path: str,
    query_id: str,
    storage_options: dict[str, str] | None = None,
    committed_before: bool = False,
) -> DeltaLayout:
    """A :class:`DeltaLayout` with both tables created-or-opened (refusals happen here).

    Args:
        committed_before: the query's checkpoint says it committed batches already.
    """
    layout = DeltaLayout(path, rejects_path, query_id, storage_options)
    layout.open(committed_before)
    return layout


__all__ = ["DeltaLayout", "open_layout"]
