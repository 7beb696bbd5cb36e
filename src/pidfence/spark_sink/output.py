"""The sink's output path: the log and rejects Delta tables, and the sink's own files beside them.

``P`` is the sink's ``path``, ``R`` its ``rejectsPath`` (default ``P/_rejects``); batch ids are
zero-padded to 20 digits; ``TAG`` is unique per task attempt and starts with the epoch of the
sink instance's claim on the output (``e3-…``, :mod:`~pidfence.spark_sink.claims`)::

    P/_delta_log/, R/_delta_log/                    the two Delta tables' logs
    P/data/QUERY/BATCH/TOPIC-PART.TAG.parquet       log rows of one task attempt (R/data/… rejects):
                                                    invisible until the batch's commit adds them
    P/_pidfence/_owner.json                         the query that owns the path (query_owner.py)
    P/_pidfence/_claims/EPOCH.json                  the sink instance that owns it now (claims.py)
    P/_pidfence/_manifests/BATCH.json               the batch's manifest (manifest.py)
    P/_pidfence/_manifests/_index/BATCH.json        every partition's position as of BATCH, every
                                                    INDEX_EVERY batches (positions.py)
    P/_pidfence/_held/BATCH/TOPIC~PART.TAG.parquet  records held for reordering at the batch's end
    P/_pidfence/_decided/BATCH/…                    what the batch decided, by identity
    P/_pidfence/_state/TOPIC~PART/BATCH.TAG.KIND    the partition's state: a cache (state_files)
    P/_pidfence/_folded/…                           batches older than retainBatches (segments.py)

Delta readers and ``VACUUM`` read only what a Delta log adds and never look under ``_pidfence/``.

**The commit point is the Delta commit of the log table**, carrying the transaction id (query id,
batch id). :meth:`Output.publish` creates the manifest if absent (an attempt's intent, kept once
written: a later attempt of the batch, or a twin driver, commits the files it names rather than
its own, unless one is gone before either table holds the batch), commits the rejects table,
then the log table (:func:`~.delta.commit.commit_files`), each step only while no newer epoch
claimed the output (:func:`~.claims.check_epoch`). A batch is committed when the log table's
transaction version for the query is at or above it. The sink never reads the tables' rows
back: producer state derives from the decisions files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from pidfence.spark_sink import query_owner
from pidfence.spark_sink.claims import check_epoch, tag_epoch
from pidfence.spark_sink.crash_points import crash_point
from pidfence.spark_sink.decisions import decided_rows
from pidfence.spark_sink.delta.commit import check_log, commit_files, table_rows
from pidfence.spark_sink.delta.errors import DeltaTableError, TableGone
from pidfence.spark_sink.delta.stats import file_stats
from pidfence.spark_sink.delta.table import (
    OWN_DIR,
    TableKind,
    cached_table,
    check_table,
    check_tables,
)
from pidfence.spark_sink.delta.tip import Tip, query_tip
from pidfence.spark_sink.errors import ManifestUnreadable
from pidfence.spark_sink.manifest import (
    KINDS,
    BatchManifest,
    PartCommit,
    PartFiles,
    Position,
    part_name,
)
from pidfence.spark_sink.options import rejects_path_of
from pidfence.spark_sink.positions import find_positions, write_index
from pidfence.spark_sink.schema import HELD_SCHEMA, conform
from pidfence.spark_sink.segments import folded_decided, folded_manifest, folded_manifests
from pidfence.spark_sink.storage import Store, batch_name
from pidfence.wire import PidfenceError

#: Query id of an output opened for reading when no query owns the path yet.
NO_OWNER: Final = "noquery0"
MANIFESTS: Final = "_manifests"
#: (log path, rejects path) of the outputs this process opened.
_OPENED: set[tuple[str, str]] = set()


@dataclass(frozen=True, slots=True)
class PartAttempt:
    """One (topic, partition)'s part of a batch as one task attempt writes it: its files carry
    the attempt's ``tag`` (:func:`~pidfence.spark_sink.claims.new_tag`)."""

    batch_id: int
    tag: str
    topic: str
    partition: int


class Output:
    """The output path of one streaming query: its two Delta tables and the sink's own files.

    Args:
        path: the sink's ``path`` (the log table's root).
        rejects_path: the sink's ``rejectsPath`` (the rejects table's root).
        query_id: the streaming query's id: the Delta transaction ids' app id.
        epoch: the epoch of this instance's claim on the output (0: unfenced).
    """

    def __init__(self, path: str, rejects_path: str, query_id: str, epoch: int = 0) -> None:
        self.epoch = epoch
        self.log = Store.at(path.rstrip("/"))
        self.rejects = Store.at(rejects_path.rstrip("/"))
        #: The sink's own files: ``P/_pidfence``.
        self.own = self.log.child(OWN_DIR)
        self.query_id = query_id
        self._version: int | None = None
        self._tables: dict[TableKind, DeltaTable] = {}

    @classmethod
    def reading(cls, path: str, rejects_path: str | None = None) -> Output:
        """An existing output as its owner query committed it, for reading.

        Args:
            path: the sink's ``path``.
            rejects_path: the sink's ``rejectsPath`` (default ``<path>/_rejects``).
        """
        path = path.rstrip("/")
        found = cls(path, rejects_path_of(path, rejects_path), NO_OWNER)
        found.query_id = query_owner.owner_of(found.own) or NO_OWNER
        return found

    def table(self, kind: str) -> Store:
        """The root of the log (``"log"``) or the rejects (``"rejects"``) table."""
        return self.rejects if kind == "rejects" else self.log

    # ----------------------------------------------------------------------------- tables

    def open(self, committed_before: bool = False) -> None:
        """Create-or-open both tables (driver, at query start): refuses a non-pidfence table
        at either path before anything is written at either.

        Args:
            committed_before: the query's checkpoint says it committed batches already.

        Raises:
            TableGone: a table is missing although batches were committed to it (its manifests
                or the checkpoint say so): creating an empty one would hide the loss; or the
                log table holds none of the batches the checkpoint committed (replaced).
        """
        key = (self.log.uri, self.rejects.uri)
        if not (key in _OPENED and self._reopen()):
            check_tables(
                self.log, self.rejects, lambda: committed_before or bool(self._manifest_ids())
            )
            self._table("rejects")
            self._table("log")
            _OPENED.add(key)
        if committed_before and self.query_id != NO_OWNER and self.committed_version() < 0:
            raise TableGone.replaced(self.log.uri, self.query_id)

    def _reopen(self) -> bool:
        """Open both tables again in a process that opened them before (Spark builds a writer
        for every batch, in the driver and in the commit process): bring the kept tables up
        to date and check them as a fresh open would, without replaying their logs. False when
        anything looks different (then the fresh open decides)."""
        tables: dict[TableKind, DeltaTable] = {}
        kinds: tuple[TableKind, TableKind] = ("rejects", "log")
        try:
            for kind in kinds:
                store = self.table(kind)
                dt = cached_table(store.uri, kind, create=False)
                check_table(dt, kind, store.uri)
                # A kept table whose log was deleted still answers from memory.
                check_log(store, dt.version())
                tables[kind] = dt
        except (PidfenceError, DeltaError, OSError):
            return False
        self._tables.update(tables)
        return True

    def _table(self, kind: TableKind, create: bool = True) -> DeltaTable:
        if kind not in self._tables:
            store = self.table(kind)
            self._tables[kind] = cached_table(store.uri, kind, create=create)
        return self._tables[kind]

    def _tip(self, kind: TableKind = "log") -> Tip:
        """A table's newest version, id and this query's transaction version, read without
        listing its log (:mod:`~pidfence.spark_sink.delta.tip`)."""
        return query_tip(self.table(kind), self.query_id, lambda: self._table(kind, create=False))

    def committed_version(self) -> int:
        """The newest batch id committed for this query (-1 when none), cached per instance."""
        if self._version is None:
            try:
                version = self._tip().txn
            except TableNotFoundError:
                version = None
            self._version = -1 if version is None else version
        return self._version

    # ----------------------------------------------------------------------------- lookups

    def manifest_path(self, batch_id: int) -> str:
        """Where the batch's manifest is while it is not folded."""
        return self.own.join(MANIFESTS, batch_name(batch_id) + ".json")

    def _manifest_ids(self) -> list[int]:
        names = self.own.list(self.own.join(MANIFESTS))
        return [int(n[:-5]) for n in names if n.endswith(".json")]

    def committed(self, batch_id: int) -> BatchManifest | None:
        """The batch's manifest if the log table's transaction id says it is committed."""
        if batch_id > self.committed_version():
            return None
        try:
            return self._manifest_at(self.manifest_path(batch_id))
        except FileNotFoundError:
            folded = folded_manifest(self.own, batch_id)
            if folded is not None:
                return folded
            raise _damaged(
                f"{self.log.uri}: batch {batch_id} is committed in the Delta log but its "
                f"manifest {self.manifest_path(batch_id)} is missing"
            ) from None

    def _manifest_at(self, path: str) -> BatchManifest:
        """The manifest stored at ``path`` (:class:`ManifestUnreadable` names the path)."""
        data = self.own.read(path)
        try:
            return BatchManifest.decode(data)
        except ManifestUnreadable as exc:
            raise ManifestUnreadable(f"{path}: {exc}") from exc

    def intent(self, batch_id: int) -> BatchManifest | None:
        """The batch's manifest, committed or not (None: no attempt published one)."""
        try:
            return self._manifest_at(self.manifest_path(batch_id))
        except FileNotFoundError:
            return None

    def last_committed_before(self, batch_id: int) -> int | None:
        """The newest committed batch below ``batch_id`` (a manifest beyond the Delta
        transaction version is an attempt's that never committed); in the steady state
        ``batch_id - 1`` (Spark numbers batches consecutively), found without a listing."""
        top = min(batch_id - 1, self.committed_version())
        if top == batch_id - 1 >= 0 and self.own.exists(self.manifest_path(top)):
            return top
        ids = [b for b in self._manifest_ids() if b <= top]
        return ids[-1] if ids else None

    def committed_ids(self) -> list[int]:
        """Every batch this query committed to the log table, ascending (re-reads the table's
        transaction version: a manifest above it belongs to an attempt that never committed)."""
        self._version = None
        self._tables.pop("log", None)
        top = self.committed_version()
        return [b for b in self._manifest_ids() if b <= top]

    def manifests(self, after: int = -1) -> Iterator[BatchManifest]:
        """The manifests of the committed batches with ids above ``after``, in batch order:
        the folded ones (:mod:`~pidfence.spark_sink.segments`), then the live ones."""
        # Live ones listed first: a fold meanwhile moves some into a segment listed after.
        live = self.committed_ids()
        for folded in folded_manifests(self.own, after):
            after = folded.batch
            yield folded
        for batch_id in live:
            manifest = self.committed(batch_id) if batch_id > after else None
            if manifest is not None:
                yield manifest

    # ----------------------------------------------------------------------------- writing

    def _place(self, kind: str, part: PartAttempt) -> tuple[Store, str]:
        """Where an attempt's file of ``kind`` goes: its store, and the path relative to it."""
        batch = batch_name(part.batch_id)
        if kind in ("log", "rejects"):
            # "~" is percent-encoded by some Delta writers (compaction then cannot find it).
            name = f"{part.topic}-{part.partition}.{part.tag}.parquet"
            return self.table(kind), f"data/{self.query_id}/{batch}/{name}"
        name = f"{part_name(part.topic, part.partition)}.{part.tag}.parquet"
        return self.own, f"_{kind}/{batch}/{name}"

    def stage_part(self, part: PartAttempt, tables: dict[str, pa.Table]) -> PartFiles:
        """Write one partition's ``log``, ``rejects`` and ``held`` rows and its decisions under
        attempt-unique names (empty ones are skipped), invisible until published (which makes
        them durable first: :meth:`publish`).

        The Delta statistics of the data files are taken here, in parallel tasks, rather than
        from each file's footer on the driver.
        """
        log, rejects = tables.get("log"), tables.get("rejects")
        staged = {**tables, "decided": decided_rows(log, rejects)}
        for kind, rows in (("log", log), ("rejects", rejects)):
            if rows is not None and rows.num_rows:
                staged[kind] = table_rows(rows, kind)  # type: ignore[arg-type]
        names: dict[str, str] = {}
        for kind in KINDS:
            rows = staged.get(kind)
            if rows is None or not rows.num_rows:
                continue
            store, rel = self._place(kind, part)
            # Snappy, Delta's own default codec: a quarter cheaper to write than zstd
            # (bench/sink_task_cost.py), files somewhat larger.
            store.write_table(
                store.join(rel), rows, "snappy" if kind in ("log", "rejects") else "zstd"
            )
            names[kind] = rel
        stats: dict[str, str] = {k: file_stats(staged[k]) for k in ("log", "rejects") if k in names}
        return PartFiles(**names, stats=stats)

    def publish(self, manifest: BatchManifest) -> BatchManifest:
        """Create the batch's manifest if absent, commit the rejects table (when the batch has
        rejects), then the log table (the commit point); each step only while this instance's
        epoch is the newest (:func:`~pidfence.spark_sink.claims.check_epoch`).

        Returns the batch's manifest as committed: ``manifest``, or the one an earlier attempt
        (a crashed run, a twin driver) created first, whose files are then the ones committed
        (unless a file it names is gone and neither table holds the batch: then ``manifest``).

        Raises:
            OutputFenced: a newer sink instance claimed the output.
        """
        batch_id = manifest.batch
        found = self.committed(batch_id)
        if found is not None:
            return found
        check_epoch(self.own, self.epoch)
        # The tasks staged their files without a fsync each; make them durable before the
        # manifest names them (one flush per batch; the manifest itself is fsynced).
        self._sync()
        path = self.manifest_path(batch_id)
        if not self.own.put_if_absent(path, manifest.encode()):
            intent = self._manifest_at(path)
            done = self._tip("rejects").txn  # None: no batch of this query yet
            if self._staged(intent) or (done is not None and done >= batch_id):
                manifest = intent
            else:  # a file it names is gone, and no table holds the batch: ours replaces it
                self.own.put(path, manifest.encode())
        kinds: tuple[TableKind, TableKind] = ("rejects", "log")
        info = manifest.figures()
        for kind in kinds:
            files = [
                (rel, part.files.stats.get(kind))
                for part in manifest.parts
                if (rel := part.files.of(kind)) is not None
            ]
            if kind == "log" or files:
                check_epoch(self.own, self.epoch)
                commit_files(self.table(kind), kind, self.query_id, batch_id, files, info=info)
                # deltalake does not fsync its commit: make the rejects durable before the log's
                # commit point, and the batch before Spark counts it committed.
                self.table(kind).sync()
                self._tables.pop(kind, None)
            if kind == "rejects":
                crash_point("rejects_committed")
        self._version = None
        return manifest

    def _staged(self, intent: BatchManifest) -> bool:
        """Whether every table file ``intent`` names is in place."""
        named = ((k, p.files.of(k)) for p in intent.parts for k in ("log", "rejects"))
        return all(self.table(k).exists(self.table(k).join(rel)) for k, rel in named if rel)

    def _sync(self) -> None:
        """:meth:`~pidfence.spark_sink.storage.Store.sync` the file systems of both tables."""
        self.log.sync()
        if not self.rejects.root.startswith(self.log.root + "/"):
            self.rejects.sync()

    def discard(self, batch_id: int, keep: set[str]) -> None:
        """Delete the batch's files of attempts at this instance's epoch or older that neither
        ``keep`` (relative paths) nor a table names: leftovers of failed attempts and of fenced
        instances, never read. A newer epoch's files are never touched."""
        for kind in KINDS:
            store, rel = self._place(kind, PartAttempt(batch_id, "x", "x", 0))
            folder = rel.rpartition("/")[0]
            doomed = set()
            for name in store.list(store.join(folder)):
                epoch = tag_epoch(name.removesuffix(".parquet").rpartition(".")[2])
                if epoch is not None and epoch <= self.epoch:
                    doomed.add(f"{folder}/{name}")
            doomed -= keep
            if doomed and store is not self.own:
                # Files a table adds are the table's, whatever the manifest names.
                doomed -= self._added(store, folder)
            for path in doomed:
                store.delete(store.join(path))

    def _added(self, table: Store, folder: str) -> set[str]:
        """The files under ``folder`` that the Delta table at ``table`` adds."""
        kind: TableKind = "rejects" if table is self.rejects else "log"
        actions = pa.table(self._table(kind, create=False).get_add_actions(flatten=True))
        paths = (unquote(p) for p in actions.column("path").to_pylist())
        return {p for p in paths if p.startswith(f"{folder}/")}

    # ----------------------------------------------------------------------------- reading

    def read_held(self, part: PartCommit) -> pa.Table | None:
        """The records a committed part held for reordering at the end of its batch."""
        if (rel := part.files.held) is None:
            return None
        try:
            return conform(self.own.read_table(self.own.join(rel)), HELD_SCHEMA)
        except FileNotFoundError:
            raise _damaged(f"{self.own.join(rel)}: the records it held are gone") from None

    def read_decided(self, batch_id: int, part: PartCommit) -> pa.Table | None:
        """What a committed part of batch ``batch_id`` decided, record by record (None: it only
        held records, or read none), from its file or its folded segment. The tables' rows are
        the users' (others append, OPTIMIZE, DELETE): the sink reads its own account."""
        rel = part.files.decided
        if rel is None:
            return None
        try:
            return self.own.read_table(self.own.join(rel))
        except FileNotFoundError:
            folded = folded_decided(self.own, batch_id, part)
        if folded is None:  # it named decisions: "decided nothing" would be a silent loss
            raise _damaged(f"{self.own.join(rel)}: batch {batch_id}'s decisions are gone")
        return folded

    # ------------------------------------------------------------------------ the index

    def positions(self, last: int) -> dict[str, Position]:
        """Per partition (``TOPIC~PART``), the newest committed batch <= ``last`` that read it
        (:func:`~pidfence.spark_sink.positions.find_positions`)."""
        key = (self.own.uri, self.query_id, self._tip().table_id)
        return find_positions(self.own, key, last, self.committed, last <= self.committed_version())

    def write_index(self, batch_id: int) -> None:
        """Write the positions index as of the committed ``batch_id`` (while this instance
        still holds the output)."""
        check_epoch(self.own, self.epoch)
        write_index(self.own, batch_id, self.positions(batch_id))


def _damaged(what: str) -> DeltaTableError:
    """The error for a file a committed manifest names that is gone (not retriable)."""
    return DeltaTableError(f"{what}; pidfence's _pidfence/ directory was damaged")


def open_output(
    path: str, rejects_path: str, query_id: str, committed_before: bool = False
) -> Output:
    """An :class:`Output` with both tables created-or-opened (refusals happen here).

    Args:
        committed_before: the query's checkpoint says it committed batches already.
    """
    output = Output(path, rejects_path, query_id)
    output.open(committed_before)
    return output


__all__ = [
    "NO_OWNER",
    "Output",
    "PartAttempt",
    "open_output",
]
