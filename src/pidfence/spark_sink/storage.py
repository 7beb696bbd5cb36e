"""File layout of the output log and file-system primitives (pyarrow.fs, so object stores work).

Layout under the output path ``P`` (batch ids zero-padded to 20 digits; ``~`` cannot occur in a
Kafka topic name, so ``TOPIC~PARTITION`` is unambiguous)::

    P/_manifests/BATCH.json          commit point of one batch (create-if-absent)
    P/data/BATCH/TOPIC~PART.parquet  appended records of one batch and partition
    R/BATCH/TOPIC~PART.parquet       rejects (R = rejectsPath, default P/_rejects)
    P/_state/TOPIC~PART/BATCH.full   full state snapshot as of BATCH
    P/_state/TOPIC~PART/BATCH.delta  changes since the previous state file
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
DATA = "data"
STATE = "_state"


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
        """Write or overwrite a file (a replay writes identical bytes)."""
        self.fs.create_dir(path.rpartition("/")[0], recursive=True)
        with self.fs.open_output_stream(path) as stream:
            stream.write(data)

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
        return True

    def delete_file(self, path: str) -> None:
        """Remove a file if present."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)

    def delete_dir(self, path: str) -> None:
        """Remove a directory tree if present."""
        if self.fs.get_file_info(path).type == pafs.FileType.Directory:
            self.fs.delete_dir(path)

    def write_table(self, path: str, table: pa.Table) -> None:
        """Write Parquet (deterministic for identical input, so a replay rewrites the same file)."""
        self.fs.create_dir(path.rpartition("/")[0], recursive=True)
        pq.write_table(table, path, filesystem=self.fs, compression="zstd")

    def read_table(self, path: str) -> pa.Table:
        """Read one Parquet file."""
        return pq.read_table(path, filesystem=self.fs)


def manifest_ids(store: Store) -> list[int]:
    """Ids of the committed batches, ascending."""
    return [int(n[:-5]) for n in store.listdir(store.join(MANIFESTS)) if n.endswith(".json")]


def read_manifest(store: Store, batch_id: int) -> dict[str, Any]:
    """One batch's manifest."""
    data: dict[str, Any] = json.loads(
        store.read_bytes(store.join(MANIFESTS, batch_name(batch_id) + ".json"))
    )
    return data


def last_committed_before(store: Store, batch_id: int) -> int | None:
    """The newest committed batch id strictly below ``batch_id``."""
    ids = [b for b in manifest_ids(store) if b < batch_id]
    return ids[-1] if ids else None
