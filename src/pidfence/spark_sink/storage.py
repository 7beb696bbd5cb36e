"""File layout of the output log and file-system primitives (pyarrow.fs, so object stores work).

Layout under the output path ``P`` (batch ids zero-padded to 20 digits; ``~`` cannot occur in a
Kafka topic name, so ``TOPIC~PARTITION`` is unambiguous; ``TAG`` is unique per task attempt and
starts with the query's id, see :mod:`pidfence.spark_sink.layout`)::

    P/_owner.json                        the query that owns the path
    P/_manifests/BATCH.json              commit point of one batch (create-if-absent)
    P/_manifests/_index/BATCH.json       compacted positions of every partition as of BATCH
    P/_manifests/_index/latest           the newest index (its batch id)
    P/data/BATCH/TOPIC~PART.TAG.parquet  appended records of one batch and partition
    P/_held/BATCH/TOPIC~PART.TAG.parquet records held for reordering at the end of the batch
    P/_decided/BATCH/TOPIC~PART.TAG.parquet
                                         what the batch decided per record (Delta layout only:
                                         the manifest layout derives it from its own files)
    R/BATCH/TOPIC~PART.TAG.parquet       rejects (R = rejectsPath, default P/_rejects)
    P/_state/TOPIC~PART/BATCH.full       full state snapshot as of BATCH (a cache)
    P/_state/TOPIC~PART/BATCH.delta      changes since the previous state file (a cache)
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

MANIFESTS = "_manifests"
INDEX = "_manifests/_index"
DATA = "data"
HELD = "_held"
DECIDED = "_decided"
STATE = "_state"
OWNER = "_owner.json"
#: Columns with a handful of values per file; only these get Parquet dictionary encoding, which
#: costs more than it saves on keys, values, offsets and sequence numbers (bench/sink.py).
DICTIONARY_COLUMNS = frozenset(
    {"topic", "partition", "generation", "verdict", "batch", "timestampType"}
)
#: Schema metadata key of tables :func:`write_parquet` writes delta-encoded, uncompressed.
DELTA_ENCODED = b"pidfence.delta_encoded"


def batch_name(batch_id: int) -> str:
    """A batch id as a sortable name."""
    return f"{batch_id:020d}"


def part_name(topic: str, partition: int) -> str:
    """File-name form of a (topic, partition)."""
    return f"{topic}~{partition}"


def parse_part_name(name: str) -> tuple[str, int]:
    """Inverse of :func:`part_name`."""
    topic, _, partition = name.rpartition("~")
    return topic, int(partition)


@dataclass(frozen=True)
class Store:
    """A root directory on some pyarrow file system."""

    fs: pafs.FileSystem
    root: str

    @classmethod
    def at(cls, path: str) -> Store:
        """The store for a local path or a URI (``file://``, ``s3://``, ``gs://`` …)."""
        if "://" in path:
            fs, root = pafs.FileSystem.from_uri(path)
            return cls(fs, root.rstrip("/"))
        return cls(pafs.LocalFileSystem(), os.path.abspath(path))

    @property
    def local(self) -> bool:
        """True on the local file system (where link() gives atomic create-if-absent)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def join(self, *parts: str) -> str:
        """A path under the root."""
        return "/".join((self.root, *parts))

    def exists(self, path: str) -> bool:
        """Whether a file exists."""
        return bool(self.fs.get_file_info(path).type == pafs.FileType.File)

    def listdir(self, path: str) -> list[str]:
        """Base names directly under ``path`` (empty when it does not exist), sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def read_bytes(self, path: str) -> bytes:
        """A whole file."""
        with self.fs.open_input_stream(path) as stream:
            return bytes(stream.read())

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write or overwrite a file; readers see the old or the new bytes, never a mix.

        Locally the bytes go to a temporary file that is fsynced and renamed into place, then the
        directory is fsynced; an object store's put is atomic on its own.
        """
        parent = path.rpartition("/")[0]
        self.fs.create_dir(parent, recursive=True)
        if not self.local:
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)
            return
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self.sync_dir(parent)

    def sync_file(self, path: str) -> None:
        """Push a local file's bytes to the disk (no-op on object stores)."""
        if not self.local:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_dir(self, path: str) -> None:
        """Make a local directory's entries (new names) durable (no-op on object stores)."""
        if not self.local:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        """Publish ``data`` at ``path`` unless a file is already there; True if this call did.

        Locally the bytes go to a temporary file first and are hard-linked into place: link()
        fails if the name exists, and readers never see a half-written file. Object stores have
        no rename; there a single committer (Spark's driver) and deterministic content make a
        check-then-put safe: a second put writes the same bytes.
        """
        parent = path.rpartition("/")[0]
        self.fs.create_dir(parent, recursive=True)
        if not self.local:
            if self.exists(path):
                return False
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)
            return True
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self.sync_dir(parent)
        return True

    def delete_file(self, path: str) -> None:
        """Remove a file if present."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)

    def delete_dir(self, path: str) -> None:
        """Remove a directory tree if present."""
        if self.fs.get_file_info(path).type == pafs.FileType.Directory:
            self.fs.delete_dir(path)

    def write_table(self, path: str, table: pa.Table, compression: str = "zstd") -> None:
        """Write a Parquet file under a name nobody reads yet, and push it to the disk.

        Callers give attempt-unique names; a manifest naming the file publishes it.
        """
        self.fs.create_dir(path.rpartition("/")[0], recursive=True)
        write_parquet(table, path, self.fs, compression)
        self.sync_file(path)

    def read_table(self, path: str) -> pa.Table:
        """Read one Parquet file.

        Through ``ParquetFile``: ``pq.read_table`` first builds a dataset, which costs 2.3x as
        much on the small files a state rebuild reads by the thousand (600 vs 260 µs each).
        """
        with self.fs.open_input_file(path) as source:
            return pq.ParquetFile(source).read()


def write_parquet(
    table: pa.Table, path: str, fs: pafs.FileSystem, compression: str = "zstd"
) -> None:
    """Write ``table`` as one Parquet file, dictionary-encoding only low-cardinality columns
    (:data:`DICTIONARY_COLUMNS`). A table of identities only (``pidfence.decisions``: integers,
    no payload) is written delta-encoded and uncompressed: a few bytes per record, 4x cheaper
    to write than zstd (``bench/sink_task_cost.py``)."""
    if table.schema.metadata and table.schema.metadata.get(DELTA_ENCODED) is not None:
        encoding = {
            f.name: "DELTA_BINARY_PACKED"
            if pa.types.is_integer(f.type) or pa.types.is_timestamp(f.type)
            else "PLAIN"
            for f in table.schema
        }
        pq.write_table(
            table,
            path,
            filesystem=fs,
            compression="none",
            use_dictionary=False,
            column_encoding=encoding,
        )
        return
    dictionary = [name for name in table.column_names if name in DICTIONARY_COLUMNS]
    pq.write_table(table, path, filesystem=fs, compression=compression, use_dictionary=dictionary)


def manifest_ids(store: Store) -> list[int]:
    """Ids of the committed batches, ascending."""
    return [int(n[:-5]) for n in store.listdir(store.join(MANIFESTS)) if n.endswith(".json")]


def manifest_path(store: Store, batch_id: int) -> str:
    """Where a batch's manifest is."""
    return store.join(MANIFESTS, batch_name(batch_id) + ".json")


def read_manifest(store: Store, batch_id: int) -> dict[str, Any]:
    """One batch's manifest."""
    data: dict[str, Any] = json.loads(store.read_bytes(manifest_path(store, batch_id)))
    return data


def try_manifest(store: Store, batch_id: int) -> dict[str, Any] | None:
    """One batch's manifest, or None when the batch is not committed."""
    try:
        return read_manifest(store, batch_id)
    except FileNotFoundError:
        return None


def last_committed_before(store: Store, batch_id: int) -> int | None:
    """The newest committed batch id strictly below ``batch_id``.

    Spark numbers batches consecutively, so this is one existence check in the steady state; it
    lists the manifests only when ``batch_id - 1`` has none.
    """
    if batch_id > 0 and store.exists(manifest_path(store, batch_id - 1)):
        return batch_id - 1
    ids = [b for b in manifest_ids(store) if b < batch_id]
    return ids[-1] if ids else None
