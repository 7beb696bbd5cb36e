"""The output log and the rejects log as Delta Lake tables: their spec, create-or-open, errors.

A pidfence Delta table is an ordinary Delta table (every Delta reader opens it) whose metadata
marks it as ours: the configuration holds ``pidfence.table`` (``log`` or ``rejects``) and
``pidfence.format`` (the layout version), and every commit pidfence makes carries
``pidfence.writer`` in its commit info. :func:`open_table` refuses a path holding anything else
(another schema, another writer's Delta table, pidfence's manifest layout, stray files) before
a single byte is written.

pidfence keeps its own files under the table root in ``_pidfence/`` (staged batch files,
per-partition producer state): Delta readers, writers and ``VACUUM`` ignore paths starting
with ``_``, so nothing there is ever read as table data or deleted by table care.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import TableNotFoundError

from pidfence.spark_sink.errors import SinkError
from pidfence.spark_sink.process import (
    LOG_SCHEMA,
    REJECTS_FILE_SCHEMA,
    REJECTS_SCHEMA,
    TS_TYPE,  # noqa: F401 - re-exported for Delta callers
)

TableKind = Literal["log", "rejects"]

#: Columns of the output log (DESIGN §7), as Delta stores them: the sink's own schema.
DELTA_LOG_SCHEMA: Final = LOG_SCHEMA
#: What ``read_rejects`` returns: the log's columns plus the verdict.
REJECTS_PUBLIC_SCHEMA: Final = REJECTS_SCHEMA
#: The rejects table also keeps the raw ``pf`` header (state replays re-check it) and the batch
#: that committed each reject (a committed part's rejects are found by it after compaction).
DELTA_REJECTS_SCHEMA: Final = REJECTS_FILE_SCHEMA.append(pa.field("batch", pa.int64()))

FORMAT_VERSION: Final = "1"
TABLE_KEY: Final = "pidfence.table"
FORMAT_KEY: Final = "pidfence.format"
WRITER_KEY: Final = "pidfence.writer"
WRITER: Final = "pidfence-sink"
#: pidfence's own files under a table root (hidden from Delta readers and VACUUM).
OWN_DIR: Final = "_pidfence"
#: Where executors write a batch's files before the driver's commit moves them into place.
STAGING_DIR: Final = f"{OWN_DIR}/staging"
#: Where committed data files live: ``data/QUERY/BATCH/TOPIC~PARTITION.parquet``.
DATA_DIR: Final = "data"


class DeltaTableError(SinkError):
    """Base class of the Delta layer's errors."""

    retriable: ClassVar[bool] = False


class NotPidfenceTable(DeltaTableError):
    """The path holds something other than a pidfence table of this kind; nothing was written."""

    retriable: ClassVar[bool] = False


class ForeignCommit(DeltaTableError):
    """Another writer changed the table's data since pidfence's last batch; nothing was committed.

    The log's offsets are dense and the producer state is derived from the committed rows, so
    rows that pidfence did not write break both; a human has to decide what they are.
    """

    retriable: ClassVar[bool] = False


class DeltaCommitConflict(DeltaTableError):
    """A concurrent commit beat this batch's commit; nothing of the batch was committed.

    Retriable: re-run the batch (Spark re-runs it from its checkpoint); a batch that turns out to
    be committed already is then a no-op.
    """

    retriable: ClassVar[bool] = True


class StagedFileMissing(DeltaTableError):
    """A file the batch staged is gone (neither staged nor in place); nothing was committed.

    Retriable: re-running the whole batch (its ``write()`` tasks too) stages the file again.
    """

    retriable: ClassVar[bool] = True


def schema_of(kind: TableKind) -> pa.Schema:
    """The Arrow schema of a pidfence table of this kind."""
    return DELTA_REJECTS_SCHEMA if kind == "rejects" else DELTA_LOG_SCHEMA


def marker(**extra: Any) -> CommitProperties:
    """Commit properties that mark a commit as pidfence's (plus ``extra`` commit info)."""
    return CommitProperties(custom_metadata={WRITER_KEY: WRITER, **extra})


@dataclass(frozen=True)
class Location:
    """A table root as deltalake sees it (URI) and as pyarrow.fs sees it (file system + path)."""

    uri: str
    fs: pafs.FileSystem
    root: str
    storage_options: dict[str, str] | None = None

    @classmethod
    def at(cls, path: str, storage_options: dict[str, str] | None = None) -> Location:
        """A local path or a URI (``s3://``, ``gs://``, ``abfss://``, ``file://``)."""
        if "://" in path and not path.startswith("file://"):
            fs, root = pafs.FileSystem.from_uri(path)
            return cls(path.rstrip("/"), fs, root.rstrip("/"), storage_options)
        local = os.path.abspath(path.removeprefix("file://"))
        return cls(local, pafs.LocalFileSystem(), local, storage_options)

    def join(self, *parts: str) -> str:
        """A pyarrow.fs path under the root."""
        return "/".join((self.root, *parts))

    def kind_of(self, rel: str) -> pafs.FileType:
        """File type of a path relative to the root."""
        return self.fs.get_file_info(self.join(rel)).type

    def entries(self) -> list[str]:
        """Base names directly under the root (empty when it does not exist)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return sorted(i.base_name for i in infos)


def _same_schema(found: pa.Schema, expected: pa.Schema) -> bool:
    if found.names != expected.names:
        return False
    return all(
        found.field(name).type == expected.field(name).type
        or (
            pa.types.is_large_binary(found.field(name).type)
            and expected.field(name).type == pa.binary()
        )
        or (
            pa.types.is_large_string(found.field(name).type)
            and expected.field(name).type == pa.string()
        )
        for name in expected.names
    )


def check_table(dt: DeltaTable, kind: TableKind, where: str) -> None:
    """Raise :class:`NotPidfenceTable` unless ``dt`` is a pidfence table of ``kind``."""
    config = dt.metadata().configuration
    found_kind = config.get(TABLE_KEY)
    if found_kind is None:
        raise NotPidfenceTable(
            f"{where} is a Delta table that pidfence did not create (no {TABLE_KEY} property); "
            "refusing to append to another writer's table: use a new path"
        )
    if found_kind != kind:
        raise NotPidfenceTable(
            f"{where} is a pidfence {found_kind} table, not a {kind} table: point the "
            f"{'rejectsPath' if kind == 'rejects' else 'path'} option elsewhere"
        )
    if config.get(FORMAT_KEY) != FORMAT_VERSION:
        raise NotPidfenceTable(
            f"{where} has pidfence table format {config.get(FORMAT_KEY)!r}; this version "
            f"writes format {FORMAT_VERSION!r}"
        )
    found = pa.schema(dt.schema().to_arrow())
    if not _same_schema(found, schema_of(kind)):
        raise NotPidfenceTable(
            f"{where} has columns {found.names} of types "
            f"{[str(t) for t in found.types]}, not the pidfence {kind} schema "
            f"{schema_of(kind).names}; refusing to append"
        )


def _refuse_non_delta(loc: Location, kind: TableKind) -> None:
    entries = loc.entries()
    if "_manifests" in entries:
        raise NotPidfenceTable(
            f"{loc.uri} holds pidfence's manifest layout (_manifests/); the Delta layout needs "
            "a new path (or keep tableFormat=manifest for this one)"
        )
    # Names starting with "_" or "." are invisible to Delta (pidfence's own _pidfence/, _state/,
    # a nested _rejects table); anything else would become an orphan that VACUUM deletes.
    visible = [e for e in entries if not e.startswith(("_", "."))]
    if visible:
        raise NotPidfenceTable(
            f"{loc.uri} is not empty and not a Delta table ({', '.join(visible[:5])}); "
            f"refusing to create the pidfence {kind} table over other files"
        )


def open_table(
    path: str,
    kind: TableKind,
    *,
    create: bool = True,
    storage_options: dict[str, str] | None = None,
) -> DeltaTable:
    """The pidfence Delta table of ``kind`` at ``path``, created when absent (if ``create``).

    Raises:
        NotPidfenceTable: the path holds another Delta table (other schema, other writer, the
            other kind), pidfence's manifest layout, or other files. Nothing is written then.
        TableNotFoundError: no table there and ``create`` is False.
    """
    loc = Location.at(path, storage_options)
    try:
        dt = DeltaTable(loc.uri, storage_options=storage_options)
    except TableNotFoundError:
        if not create:
            raise
        _refuse_non_delta(loc, kind)
        try:
            dt = DeltaTable.create(
                loc.uri,
                schema_of(kind),
                mode="error",
                name=f"pidfence_{kind}",
                configuration={TABLE_KEY: kind, FORMAT_KEY: FORMAT_VERSION},
                storage_options=storage_options,
                commit_properties=marker(),
                raise_if_key_not_exists=False,
            )
        except Exception as exc:  # noqa: BLE001 - a concurrent creator won: open theirs
            try:
                dt = DeltaTable(loc.uri, storage_options=storage_options)
            except TableNotFoundError:
                raise exc from None
    check_table(dt, kind, loc.uri)
    return dt


def check_path(path: str, kind: TableKind, storage_options: dict[str, str] | None = None) -> bool:
    """Whether ``path`` holds a pidfence table of ``kind`` (True) or may get one (False).

    Writes nothing. Raises :class:`NotPidfenceTable` like :func:`open_table` would, so a caller
    can check every table of a sink before creating any of them.
    """
    loc = Location.at(path, storage_options)
    try:
        dt = DeltaTable(loc.uri, storage_options=storage_options)
    except TableNotFoundError:
        _refuse_non_delta(loc, kind)
        return False
    check_table(dt, kind, loc.uri)
    return True


_CACHE: dict[tuple[str, str], DeltaTable] = {}
_CACHE_LOCK = threading.Lock()


def cached_table(
    path: str,
    kind: TableKind,
    *,
    create: bool = True,
    storage_options: dict[str, str] | None = None,
) -> DeltaTable:
    """:func:`open_table`, kept per process and brought up to date incrementally.

    Loading a Delta table replays its log from the last checkpoint (tens of ms after a few
    dozen commits); bringing a loaded one up to date reads only the new commits. Spark reuses its
    Python workers, so each executor and the driver pay the full load once per table.
    """
    key = (Location.at(path, storage_options).uri, kind)
    with _CACHE_LOCK:
        dt = _CACHE.get(key)
    if dt is not None:
        try:
            dt.update_incremental()
        except Exception:  # noqa: BLE001 - the table was replaced or removed: load it afresh
            dt = None
        else:
            check_table(dt, kind, key[0])
            return dt
    dt = open_table(path, kind, create=create, storage_options=storage_options)
    with _CACHE_LOCK:
        _CACHE[key] = dt
    return dt


def holds_delta(path: str, storage_options: dict[str, str] | None = None) -> bool:
    """Whether ``path`` holds a Delta table (readers dispatch on it: Delta or manifest layout)."""
    loc = Location.at(path, storage_options)
    return bool(DeltaTable.is_deltatable(loc.uri, storage_options))
