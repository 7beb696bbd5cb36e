"""One folder on a local disk or an object store, as the sink reads and writes it (pyarrow.fs).

Everything the sink stores goes through :class:`Store`: its Delta tables' data files, and its own
files under ``_pidfence/`` (manifests, state, held records, decisions, the owner record). The
operations are the ones an object store offers: read, put (whole-object replace), put if absent
(the one atomic step the commit protocol needs), exists, delete, list. No step of the protocol
renames: on a local disk a put goes through a temporary file and ``os.replace`` so a reader never
sees half of it, and put-if-absent through ``link()``, which fails when the name exists. On S3,
put-if-absent is a conditional put (``If-None-Match: *``, through boto3: pyarrow's S3 file system
has none), which the store answers 412 when the key exists; put, read, delete and the Parquet
files go through boto3 too, one request each (:mod:`~pidfence.spark_sink.s3_requests`), and
nothing creates folders there: an object store has none.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pidfence.spark_sink import s3_requests
from pidfence.spark_sink.object_store import arrow_uri, is_remote

#: Columns with a handful of values per file; only these get Parquet dictionary encoding, which
#: costs more than it saves on keys, values, offsets and sequence numbers (bench/sink.py).
DICTIONARY_COLUMNS: Final = frozenset(
    {"topic", "partition", "generation", "verdict", "batch", "timestampType"}
)
#: Linux's ``syncfs(fd)`` (one file system), when the C library has it.
_syncfs = getattr(ctypes.CDLL(None), "syncfs", None)
#: Schema metadata key of tables :func:`write_parquet` writes delta-encoded, uncompressed.
DELTA_ENCODED: Final = b"pidfence.delta_encoded"


def batch_name(batch_id: int) -> str:
    """A batch id as a sortable name (20 digits)."""
    return f"{batch_id:020d}"


class FileStat(NamedTuple):
    """A file's ``size`` in bytes and modification time ``mtime_ns`` (0 when the store keeps
    none)."""

    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Store:
    """A folder on some pyarrow file system.

    Attributes:
        fs: the file system.
        root: the folder as ``fs`` names it; every path a method takes is :meth:`join`'s.
        uri: the folder as deltalake names it (a local path, or the URI it was given).

    Credentials and the endpoint come from the standard AWS environment, which deltalake, boto3
    and pyarrow's S3 file system all read, and where ``pidfence sink --storage-option`` puts
    them (:mod:`~pidfence.spark_sink.object_store`).
    """

    fs: pafs.FileSystem
    root: str
    uri: str

    @classmethod
    def at(cls, path: str) -> Store:
        """A local path or a URI (``file://``, ``s3://``, ``s3a://``, ``gs://`` …)."""
        if is_remote(path):
            uri = arrow_uri(path).rstrip("/")
            fs, root = pafs.FileSystem.from_uri(uri)
            return cls(fs, root.rstrip("/"), uri)
        local = os.path.abspath(path.removeprefix("file://"))
        return cls(pafs.LocalFileSystem(), local, local)

    def child(self, *parts: str) -> Store:
        """The folder ``parts`` below this one, as a store of its own."""
        sub = "/".join(parts)
        return Store(self.fs, self.join(sub), f"{self.uri}/{sub}")

    @property
    def s3(self) -> bool:
        """True on S3 (whole objects through boto3, one request each)."""
        return isinstance(self.fs, pafs.S3FileSystem)

    @property
    def local(self) -> bool:
        """True on the local file system (fsync and link() apply)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def join(self, *parts: str) -> str:
        """A path under the root."""
        return "/".join((self.root, *parts))

    def exists(self, path: str) -> bool:
        """Whether a file exists."""
        return bool(self.fs.get_file_info(path).type == pafs.FileType.File)

    def list(self, path: str) -> list[str]:
        """Base names directly under ``path`` (empty when it does not exist), sorted.

        Locally through ``os.listdir``: Arrow's listing fails ("Cannot list directory", errno 2)
        despite ``allow_not_found`` when the folder is created while it lists (twin sinks on a
        new output: one lists the claims while the other makes their folder).
        """
        if self.local:
            try:
                return sorted(os.listdir(path))
            except FileNotFoundError:
                return []
        infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def is_dir(self, path: str) -> bool:
        """Whether a folder exists (on an object store: whether any key lies below it)."""
        return bool(self.fs.get_file_info(path).type == pafs.FileType.Directory)

    def stat(self, path: str) -> FileStat | None:
        """A file's size and modification time; None when no file is there."""
        info = self.fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            return None
        return FileStat(info.size or 0, info.mtime_ns or 0)

    def files(self, path: str) -> Iterator[tuple[str, FileStat]]:
        """Every file below ``path``, at any depth, with its path relative to ``path``; none
        when ``path`` does not exist."""
        infos = self.fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        start = len(path.rstrip("/")) + 1
        for info in infos:
            if info.type == pafs.FileType.File:
                yield info.path[start:], FileStat(info.size or 0, info.mtime_ns or 0)

    def drop_empty_dir(self, path: str) -> None:
        """Remove the folder ``path`` if it is empty. Only local disks have folders to remove:
        an object store's "folders" are key prefixes, gone with their last key."""
        if self.local:
            with contextlib.suppress(OSError):  # not empty, or already gone
                os.rmdir(path)

    def drop_empty_dirs_below(self, path: str) -> None:
        """Remove every folder below ``path`` that is (or becomes) empty, deepest first."""
        if self.local:
            for folder, _, _ in os.walk(path, topdown=False):
                if folder != path:
                    self.drop_empty_dir(folder)

    def read(self, path: str) -> bytes:
        """A whole file."""
        if self.s3:
            return s3_requests.get(path)
        with self.fs.open_input_stream(path) as stream:
            return bytes(stream.read())

    def put(self, path: str, data: bytes) -> None:
        """Write or replace a file durably; readers see the old or the new bytes, never a mix."""
        if self.s3:
            s3_requests.put(path, data)
            return
        parent = path.rpartition("/")[0]
        self.fs.create_dir(parent, recursive=True)
        if not self.local:
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)
            return
        tmp = self._local_tmp(parent, data)
        try:
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._sync_dir(parent)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Publish ``data`` at ``path`` unless a file is already there; True if this call did.

        Locally the bytes are hard-linked into place from a temporary file: link() fails if the
        name exists, and readers never see a half-written file. On S3 it is a conditional put
        (:func:`~pidfence.spark_sink.s3_requests.put_if_absent`). On another object store it is
        a check then a put, atomic only for a single writer: the sink's options refuse such a
        store for writing (readers like ``pidfence verify`` never put).
        """
        if self.s3:
            return s3_requests.put_if_absent(path, data)
        parent = path.rpartition("/")[0]
        self.fs.create_dir(parent, recursive=True)
        if not self.local:
            if self.exists(path):
                return False
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)
            return True
        tmp = self._local_tmp(parent, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self._sync_dir(parent)
        return True

    def delete(self, path: str) -> None:
        """Remove a file if present."""
        if self.s3:
            s3_requests.delete(path)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)

    def write_table(
        self,
        path: str,
        table: pa.Table,
        compression: str = "zstd",
        group_rows: int | None = None,
    ) -> None:
        """Write one Parquet file under a name nobody reads yet (see :meth:`put_staged`), in row
        groups of ``group_rows`` rows (None: pyarrow's default)."""
        if self.s3:
            buffer = pa.BufferOutputStream()
            write_parquet(table, buffer, None, compression, group_rows)
            s3_requests.put(path, buffer.getvalue().to_pybytes())
            return
        self.fs.create_dir(path.rpartition("/")[0], recursive=True)
        write_parquet(table, path, self.fs, compression, group_rows)

    def put_staged(self, path: str, data: bytes) -> None:
        """Write a file under an attempt-unique name that nothing reads until a commit names it.

        No temporary file and no fsync: a crash leaves at worst a partial file no commit names.
        Files are made durable together by :meth:`sync` before the commit that names them (one
        flush per batch, where a fsync per file cost about 35 ms per partition per batch).
        """
        if self.s3:
            s3_requests.put(path, data)
            return
        self.fs.create_dir(path.rpartition("/")[0], recursive=True)
        with self.fs.open_output_stream(path) as stream:
            stream.write(data)

    def sync(self) -> None:
        """Make everything written to this local file system durable (``syncfs``: files written
        by other processes of this host too, e.g. a batch's tasks); before a commit names them.

        Object stores need none: a put is durable when it returns. On a shared file system (NFS)
        a writer's close already flushed its file to the server.
        """
        if not self.local:
            return
        fd = os.open(self.root if os.path.isdir(self.root) else "/", os.O_RDONLY)
        try:
            if _syncfs is None or _syncfs(fd) != 0:
                os.sync()  # no syncfs (not Linux), or it failed: flush every file system
        finally:
            os.close(fd)

    def read_table(self, path: str) -> pa.Table:
        """Read one Parquet file.

        Through ``ParquetFile``: ``pq.read_table`` first builds a dataset, which costs 2.3x as
        much on the small files a state rebuild reads by the thousand (600 vs 260 µs each).
        """
        if self.s3:
            return pq.ParquetFile(pa.BufferReader(s3_requests.get(path))).read()
        with self.fs.open_input_file(path) as source:
            return pq.ParquetFile(source).read()

    def _local_tmp(self, parent: str, data: bytes) -> str:
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def _sync_dir(self, path: str) -> None:
        """Make a local folder's entries (new names) durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_parquet(
    table: pa.Table,
    path: str | pa.NativeFile,
    fs: pafs.FileSystem | None,
    compression: str = "zstd",
    group_rows: int | None = None,
) -> None:
    """Write ``table`` as one Parquet file (at ``path`` on ``fs``, or into a stream),
    dictionary-encoding only low-cardinality columns (:data:`DICTIONARY_COLUMNS`). A table of
    identities only (``pidfence.decisions``: integers, no payload) is written delta-encoded and
    uncompressed: a few bytes per record, 4x cheaper to write than zstd
    (``bench/sink_task_cost.py``)."""
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
            row_group_size=group_rows,
        )
        return
    dictionary = [name for name in table.column_names if name in DICTIONARY_COLUMNS]
    pq.write_table(
        table,
        path,
        filesystem=fs,
        compression=compression,
        use_dictionary=dictionary,
        row_group_size=group_rows,
    )


__all__ = [
    "DELTA_ENCODED",
    "DICTIONARY_COLUMNS",
    "FileStat",
    "Store",
    "batch_name",
    "write_parquet",
]
