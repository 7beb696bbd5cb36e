"""The sink's :class:`~pidfence.spark_sink.layout.BatchLayout` over Delta Lake tables.

The output log ``P`` and the rejects log ``R`` are pidfence Delta tables (:mod:`delta_table`);
everything else the commit protocol keeps is pidfence's own and lives under ``P/_pidfence/``
(``R/_pidfence/`` for staged rejects), which Delta readers and ``VACUUM`` never look at::

    P/_pidfence/data/BATCH/TOPIC~PART.TAG.parquet   staged log files (one per task attempt)
    R/_pidfence/BATCH/TOPIC~PART.TAG.parquet        staged rejects
    P/_pidfence/_held/BATCH/…                       records held for reordering (committed with
                                                    the batch, read only by the sink)
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

Committed rows are read back by content, not by file name (compaction rewrites files): a part's
log rows are its ``[log_start, log_end)`` range, its rejects the rows whose ``batch`` column is
the batch id.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any, ClassVar, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from pidfence.spark_sink.delta_commit import Move, commit_moves, data_dir, with_private_columns
from pidfence.spark_sink.delta_table import (
    DELTA_LOG_SCHEMA,
    OWN_DIR,
    DeltaTableError,
    Location,
    TableKind,
    cached_table,
    check_path,
    schema_of,
)
from pidfence.spark_sink.layout import ParquetLayout, PartFiles, part_file
from pidfence.spark_sink.storage import manifest_ids, manifest_path

_KINDS: Final[dict[str, TableKind]] = {"log": "log", "rejects": "rejects"}
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

    #: Called with ``"rejects_committed"`` between the two Delta commits (crash tests kill the
    #: process there); None in production.
    hook: ClassVar[Callable[[str], None] | None] = None

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

    def open(self) -> None:
        """Create-or-open both tables (driver, at query start): refuses a non-pidfence table
        at either path before anything is written at either."""
        check_path(self.path, "log", self.storage_options)
        check_path(self.rejects_path, "rejects", self.storage_options)
        self._table("rejects")
        self._table("log")

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

    def stage_part(
        self,
        batch_id: int,
        tag: str,
        topic: str,
        partition: int,
        tables: dict[str, pa.Table],
    ) -> PartFiles:
        """Stage under ``_pidfence/`` (invisible to Delta); rejects get the ``batch`` column."""
        staged = dict(tables)
        rejects = staged.get("rejects")
        if rejects is not None and rejects.num_rows:
            staged["rejects"] = _rejects_rows(rejects, batch_id)
        log = staged.get("log")
        if log is not None and log.num_rows:
            staged["log"] = log.select(DELTA_LOG_SCHEMA.names).cast(DELTA_LOG_SCHEMA)
        return super().stage_part(batch_id, tag, topic, partition, staged)

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
                self._move(kind, batch_id, rel)
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
            if kind == "rejects" and DeltaLayout.hook is not None:
                DeltaLayout.hook("rejects_committed")
        self._version = None
        return done

    def _drop_sources(self, path: str, moves: list[Move]) -> None:
        loc = Location.at(path, self.storage_options)
        for move in moves:
            with contextlib.suppress(FileNotFoundError):
                loc.fs.delete_file(loc.join(move.src))

    def _move(self, kind: str, batch_id: int, rel: str) -> Move:
        name = rel.rpartition("/")[2].replace("~", _SEPARATOR)
        return Move(f"{OWN_DIR}/{rel}", f"{data_dir(self.query_id, batch_id)}/{name}")

    # ----------------------------------------------------------------------------- reading

    def read_part(self, batch_id: int, part: dict[str, Any], kind: str) -> pa.Table | None:
        """A committed part's rows: log by its log offset range, rejects by batch, held from
        pidfence's own file."""
        if kind == "held":
            return super().read_part(batch_id, part, kind)
        topic, partition = str(part["topic"]), int(part["partition"])
        where = (pc.field("topic") == topic) & (pc.field("partition") == partition)
        if kind == "log":
            if not int(part.get("appended", 0)):
                return None
            lo, hi = int(part["log_start"]), int(part["log_end"])
            where = where & (pc.field("log_offset") >= lo) & (pc.field("log_offset") < hi)
            order = "log_offset"
        else:
            if not int(part.get("rejected", 0)):
                return None
            where = where & (pc.field("batch") == batch_id)
            order = "kafka_offset"
        table = self._table(_KINDS[kind], create=False)
        schema = schema_of(_KINDS[kind])
        rows = table.to_pyarrow_dataset().to_table(filter=where)
        return rows.select(schema.names).cast(schema).sort_by(order)


def _rejects_rows(rejects: pa.Table, batch_id: int) -> pa.Table:
    return with_private_columns(rejects, "rejects", batch_id)


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, indent=1).encode()


def open_layout(
    path: str, rejects_path: str, query_id: str, storage_options: dict[str, str] | None = None
) -> DeltaLayout:
    """A :class:`DeltaLayout` with both tables created-or-opened (refusals happen here)."""
    layout = DeltaLayout(path, rejects_path, query_id, storage_options)
    layout.open()
    return layout


__all__ = ["DeltaLayout", "open_layout"]
