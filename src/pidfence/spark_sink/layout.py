"""The storage steps of the commit protocol, behind one small interface.

The commit protocol (``writer.py``) only ever asks a :class:`BatchLayout` to: look up a batch's
manifest, stage one partition's files of one task attempt, publish a manifest, read a committed
part back, discard an attempt's unpublished files, and keep a compacted index of per-partition
positions. :class:`ParquetLayout` is the built-in layout (Parquet files named by the manifest); a
table format such as Delta Lake plugs in as a second implementation.

Every staged file carries an attempt-unique ``tag`` (``<query id prefix><random>``), so a re-run
never rewrites a file a reader may see, and cleanup can tell its own query's files from another's.
Files are fsynced before the manifest that names them is published, and the manifest's directory
after it (local disks).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import pyarrow as pa

from pidfence.spark_sink.decisions import decided_rows
from pidfence.spark_sink.schema import HELD_SCHEMA, LOG_SCHEMA, REJECTS_FILE_SCHEMA, conform
from pidfence.spark_sink.storage import (
    DATA,
    DECIDED,
    HELD,
    INDEX,
    MANIFESTS,
    Store,
    batch_name,
    last_committed_before,
    manifest_ids,
    manifest_path,
    part_name,
    try_manifest,
)

#: A compacted index of every partition's position is written every this many batches, so a
#: task reads at most this many manifests to find its partition's position (flat cost).
INDEX_EVERY: Final = 64
MANIFEST_VERSION: Final = 2
#: How many characters of the query id start every tag.
QUERY_PREFIX: Final = 8
KINDS: Final = ("log", "rejects", "held", "decided")
#: The schema each kind of file is read back as (files of table format 1 included).
_READ_SCHEMA: Final = {"log": LOG_SCHEMA, "rejects": REJECTS_FILE_SCHEMA, "held": HELD_SCHEMA}


def new_tag(query_id: str) -> str:
    """An attempt-unique file tag that starts with the query's id prefix."""
    prefix = "".join(c for c in query_id if c.isalnum())[:QUERY_PREFIX].ljust(QUERY_PREFIX, "x")
    return prefix + uuid.uuid4().hex[:12]


@dataclass(frozen=True, slots=True)
class PartAttempt:
    """One (topic, partition)'s part of a batch as one task attempt stages it: its files carry
    the attempt's ``tag`` (:func:`new_tag`)."""

    batch_id: int
    tag: str
    topic: str
    partition: int


@dataclass(frozen=True)
class PartFiles:
    """The files one attempt staged for one partition: kind → path relative to its root."""

    log: str | None
    rejects: str | None
    held: str | None
    decided: str | None = None
    #: Delta ``stats`` JSON of the staged ``log`` and ``rejects`` files, where the layout
    #: keeps them (the Delta layout: its commit then reads no footer).
    stats: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, str | None]:
        """As stored in the manifest (``decided`` only where the layout writes it)."""
        files = {"log": self.log, "rejects": self.rejects, "held": self.held}
        if self.decided is not None:
            files["decided"] = self.decided
        return files


class BatchLayout(Protocol):
    """What the commit protocol needs from a table layout."""

    def committed(self, batch_id: int) -> dict[str, Any] | None:
        """The batch's manifest, or None if it is not committed."""

    def last_committed_before(self, batch_id: int) -> int | None:
        """The newest committed batch below ``batch_id``."""

    def committed_ids(self) -> list[int]:
        """Every committed batch id, ascending (read afresh on each call)."""

    def stage_part(self, part: PartAttempt, tables: dict[str, pa.Table]) -> PartFiles:
        """Write one partition's ``log``/``rejects``/``held`` tables (empty ones are skipped)
        under attempt-unique names, durably, invisible until published."""

    def publish(self, batch_id: int, manifest: dict[str, Any]) -> bool:
        """Make the batch visible, create-if-absent; True if this call did."""

    def read_part(self, batch_id: int, part: dict[str, Any], kind: str) -> pa.Table | None:
        """A committed part's ``log``, ``rejects`` or ``held`` table (None when it has none)."""

    def read_decided(self, batch_id: int, part: dict[str, Any]) -> pa.Table | None:
        """What a committed part decided per record (:mod:`decisions`; None when nothing)."""

    def discard(self, batch_id: int, prefix: str, keep: set[str]) -> None:
        """Delete the batch's files whose tag starts with ``prefix`` and that ``keep`` does not
        name (relative paths)."""

    def positions(self, last: int) -> dict[str, dict[str, Any]]:
        """Per partition (``TOPIC~PART``), the part entry of the newest committed batch <= last
        that read it, with its batch id under ``"batch"``."""

    def write_index(self, batch_id: int) -> None:
        """Compact the positions as of the committed ``batch_id``."""


class ParquetLayout:
    """The built-in layout: Parquet files under the output path, JSON manifests.

    Args:
        path: the sink's ``path``.
        rejects_path: the sink's ``rejectsPath``.
    """

    #: Parquet codec of the log and rejects files.
    compression: str = "zstd"

    def __init__(self, path: str, rejects_path: str) -> None:
        self.store = Store.at(path)
        self.rejects = Store.at(rejects_path)

    @classmethod
    def of(cls, store: Store, rejects: Store) -> ParquetLayout:
        """The layout over two already opened stores."""
        layout = cls.__new__(cls)
        layout.store, layout.rejects = store, rejects
        return layout

    # ----------------------------------------------------------------------------- lookups

    def committed(self, batch_id: int) -> dict[str, Any] | None:
        """The batch's manifest, or None."""
        return try_manifest(self.store, batch_id)

    def last_committed_before(self, batch_id: int) -> int | None:
        """The newest committed batch below ``batch_id``."""
        return last_committed_before(self.store, batch_id)

    def committed_ids(self) -> list[int]:
        """Every batch with a manifest, ascending."""
        return manifest_ids(self.store)

    def _root(self, kind: str) -> Store:
        return self.rejects if kind == "rejects" else self.store

    def _relative(self, kind: str, batch_id: int, topic: str, partition: int, tag: str) -> str:
        name = f"{part_name(topic, partition)}.{tag}.parquet"
        if kind == "log":
            return f"{DATA}/{batch_name(batch_id)}/{name}"
        if kind == "held":
            return f"{HELD}/{batch_name(batch_id)}/{name}"
        if kind == "decided":
            return f"{DECIDED}/{batch_name(batch_id)}/{name}"
        return f"{batch_name(batch_id)}/{name}"

    # ----------------------------------------------------------------------------- writing

    def stage_part(self, part: PartAttempt, tables: dict[str, pa.Table]) -> PartFiles:
        """Write the non-empty tables under attempt-unique names (fsynced)."""
        names: dict[str, str | None] = dict.fromkeys(KINDS)
        for kind in KINDS:
            table = tables.get(kind)
            if table is None or not table.num_rows:
                continue
            rel = self._relative(kind, part.batch_id, part.topic, part.partition, part.tag)
            root = self._root(kind)
            codec = self.compression if kind in ("log", "rejects") else "zstd"
            root.write_table(root.join(rel), table, codec)
            names[kind] = rel
        for kind, staged in names.items():
            if staged is not None:
                # The file's directory, and the directory holding that (the batch's folder
                # may be new), so the names survive a power loss before the manifest.
                root = self._root(kind)
                folder = root.join(staged).rpartition("/")[0]
                root.sync_dir(folder)
                root.sync_dir(folder.rpartition("/")[0])
        return PartFiles(names["log"], names["rejects"], names["held"], names["decided"])

    def publish(self, batch_id: int, manifest: dict[str, Any]) -> bool:
        """Create the manifest if absent (the commit point); fsyncs its directory."""
        body = json.dumps(manifest, sort_keys=True, indent=1).encode()
        return self.store.create_if_absent(manifest_path(self.store, batch_id), body)

    def read_part(self, batch_id: int, part: dict[str, Any], kind: str) -> pa.Table | None:
        """A committed part's table of the given kind."""
        rel = part_file(batch_id, part, kind)
        if rel is None:
            return None
        root = self._root(kind)
        table = root.read_table(root.join(rel))
        schema = _READ_SCHEMA.get(kind)
        return table if schema is None else conform(table, schema)

    def read_decided(self, batch_id: int, part: dict[str, Any]) -> pa.Table | None:
        """What a committed part decided: its own decisions file, else its log and rejects
        files (the manifest layout's are immutable and only pidfence writes them)."""
        if part_file(batch_id, part, "decided") is not None:
            return self.read_part(batch_id, part, "decided")
        log = self.read_part(batch_id, part, "log")
        rejects = self.read_part(batch_id, part, "rejects")
        if log is None and rejects is None:
            return None
        return decided_rows(log, rejects)

    def discard(self, batch_id: int, prefix: str, keep: set[str]) -> None:
        """Delete this query's unpublished files of one batch (other attempts' leftovers)."""
        for kind in KINDS:
            root = self._root(kind)
            folder = self._relative(kind, batch_id, "x", 0, "x").rpartition("/")[0]
            for name in root.listdir(root.join(folder)):
                stem = name.removesuffix(".parquet")
                tag = stem.rpartition(".")[2]
                rel = f"{folder}/{name}"
                if tag.startswith(prefix) and rel not in keep:
                    root.delete_file(root.join(rel))

    # ------------------------------------------------------------------------ the index

    def _index_path(self, batch_id: int) -> str:
        return self.store.join(INDEX, batch_name(batch_id) + ".json")

    def _latest_index(self, last: int) -> tuple[int, dict[str, dict[str, Any]]]:
        """(batch id, positions) of the newest index at or below ``last``; (-1, {}) if none."""
        try:
            latest = int(self.store.read_bytes(self.store.join(INDEX, "latest")).decode())
        except (FileNotFoundError, ValueError):
            latest = -1
        if latest > last:
            # The index moved past the batch asked about (a reader of history): step back.
            latest = (last // INDEX_EVERY) * INDEX_EVERY
        while latest >= 0:
            try:
                data = json.loads(self.store.read_bytes(self._index_path(latest)))
            except FileNotFoundError:
                latest -= INDEX_EVERY
                continue
            positions: dict[str, dict[str, Any]] = data["parts"]
            return latest, positions
        return -1, {}

    def positions(self, last: int) -> dict[str, dict[str, Any]]:
        """Positions as of ``last``: the newest index, then at most INDEX_EVERY manifests."""
        base, positions = self._latest_index(last)
        positions = dict(positions)
        for bid in range(base + 1, last + 1):
            manifest = self.committed(bid)
            if manifest is None:
                continue
            for part in manifest["parts"]:
                positions[part_name(part["topic"], int(part["partition"]))] = {
                    **part,
                    "batch": bid,
                }
        return positions

    def write_index(self, batch_id: int) -> None:
        """Write the index as of ``batch_id`` and point ``latest`` at it."""
        positions = self.positions(batch_id)
        body = json.dumps({"batch": batch_id, "parts": positions}, sort_keys=True).encode()
        self.store.write_bytes(self._index_path(batch_id), body)
        self.store.write_bytes(self.store.join(INDEX, "latest"), str(batch_id).encode())


def part_file(batch_id: int, part: dict[str, Any], kind: str) -> str | None:
    """The relative path of a committed part's file of ``kind`` (None: the part has none)."""
    del batch_id
    rel: str | None = part["files"].get(kind)
    return rel


__all__ = [
    "INDEX_EVERY",
    "MANIFESTS",
    "MANIFEST_VERSION",
    "BatchLayout",
    "ParquetLayout",
    "PartAttempt",
    "PartFiles",
    "new_tag",
    "part_file",
]
