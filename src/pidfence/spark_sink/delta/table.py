"""The output log and the rejects log as Delta Lake tables: their spec, create-or-open, errors.

A pidfence Delta table is an ordinary Delta table (every Delta reader opens it) whose metadata
marks it as ours: the configuration holds ``pidfence.table`` (``log`` or ``rejects``) and
``pidfence.format`` (the layout version), and every commit pidfence makes carries
``pidfence.writer`` in its commit info. :func:`open_table` refuses a path holding anything else
(another schema, another writer's Delta table, stray files) before a single byte is written.

pidfence keeps its own files under the table root in ``_pidfence/`` (batch manifests, the
partitions' producer state and held records): Delta readers, writers and ``VACUUM`` ignore
paths starting with ``_``, so nothing there is ever read as table data or deleted by table care.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, Literal

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import TableNotFoundError

from pidfence.spark_sink.delta.errors import NotPidfenceTable, SchemaChanged, TableGone
from pidfence.spark_sink.schema import LOG_SCHEMA, REJECTS_SCHEMA
from pidfence.spark_sink.storage import Store

TableKind = Literal["log", "rejects"]

#: Columns of the output log (DESIGN §7): the sink's one schema.
DELTA_LOG_SCHEMA: Final = LOG_SCHEMA
#: Columns of the rejects table: the log's plus ``verdict``.
DELTA_REJECTS_SCHEMA: Final = REJECTS_SCHEMA

#: Table format 2: the Kafka source's columns (``offset``, ``timestampType``, ``headers``).
FORMAT_VERSION: Final = "2"
TABLE_KEY: Final = "pidfence.table"
FORMAT_KEY: Final = "pidfence.format"
WRITER_KEY: Final = "pidfence.writer"
WRITER: Final = "pidfence-sink"
#: The log retention the sink gives the tables it creates (Delta's default is 30 days). Every
#: deltalake load or commit lists ``_delta_log/``, which on a local disk costs about 3 µs per
#: entry it keeps: at one commit a second, 30 days is 2.9M entries and seconds a batch; an hour
#: keeps it under 4,000 (docs/delta.md, "History, checkpoints, retention").
LOG_RETENTION: Final = "interval 1 hours"
#: pidfence's own files under a table root (hidden from Delta readers and VACUUM).
OWN_DIR: Final = "_pidfence"
#: Where the data files of a batch live: ``data/QUERY/BATCH/TOPIC-PARTITION.TAG.parquet``.
DATA_DIR: Final = "data"


def schema_of(kind: TableKind) -> pa.Schema:
    """The Arrow schema of a pidfence table of this kind."""
    return DELTA_REJECTS_SCHEMA if kind == "rejects" else DELTA_LOG_SCHEMA


def marker(**extra: Any) -> CommitProperties:
    """Commit properties that mark a commit as pidfence's (plus ``extra`` commit info)."""
    return CommitProperties(custom_metadata={WRITER_KEY: WRITER, **extra})


def plain_type(t: pa.DataType) -> str:
    """A type as Delta sees it: large and view variants, list field names and nullability do
    not matter (delta-rs and Spark name a list's field differently)."""
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return f"list<{plain_type(t.value_type)}>"
    if pa.types.is_struct(t):
        inner = ", ".join(
            f"{t.field(i).name}: {plain_type(t.field(i).type)}" for i in range(t.num_fields)
        )
        return f"struct<{inner}>"
    return str(t)


def schema_problems(found: pa.Schema, expected: pa.Schema) -> list[str]:
    """What keeps the sink from appending rows of ``expected`` to a table of ``found``.

    Columns another writer added are fine when nullable (the sink's rows leave them null).
    """
    problems = []
    for field in expected:
        if field.name not in found.names:
            problems.append(f"column {field.name} was removed")
        elif plain_type(found.field(field.name).type) != plain_type(field.type):
            problems.append(
                f"column {field.name} is {plain_type(found.field(field.name).type)}, the sink "
                f"writes {plain_type(field.type)}"
            )
    for field in found:
        if field.name not in expected.names and not field.nullable:
            problems.append(f"column {field.name} was added NOT NULL (the sink cannot fill it)")
    return problems


def table_schema(dt: DeltaTable) -> pa.Schema:
    """The table's current schema as Arrow."""
    return pa.schema(dt.schema().to_arrow())


def check_marker(dt: DeltaTable, kind: TableKind, where: str) -> None:
    """Raise unless ``dt`` is a pidfence table of ``kind`` and of this table format.

    Raises:
        NotPidfenceTable: another writer's table, the other kind or another format.
    """
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
    version = config.get(FORMAT_KEY)
    if version != FORMAT_VERSION:
        raise NotPidfenceTable(
            f"{where} has pidfence table format {version!r}; this version writes format "
            f"{FORMAT_VERSION!r}"
        )


def check_table(dt: DeltaTable, kind: TableKind, where: str) -> None:
    """Raise unless the sink can append to ``dt``: a pidfence table of ``kind`` whose columns
    still hold the sink's rows.

    Raises:
        NotPidfenceTable: see :func:`check_marker`.
        SchemaChanged: a column the sink writes was removed or retyped.
    """
    check_marker(dt, kind, where)
    problems = schema_problems(table_schema(dt), schema_of(kind))
    if problems:
        raise schema_changed(dt, where, problems)


#: Operations that may change a table's columns (named when the sink's columns changed).
SCHEMA_OPERATIONS: Final = frozenset(
    {
        "ADD COLUMNS",
        "ADD COLUMN",
        "CHANGE COLUMN",
        "CHANGE COLUMNS",
        "DROP COLUMNS",
        "DROP COLUMN",
        "RENAME COLUMN",
        "REPLACE COLUMNS",
        "CREATE OR REPLACE TABLE",
        "REPLACE TABLE",
        "REPLACE TABLE AS SELECT",
        "RESTORE",
        "UPDATE SCHEMA",
        "WRITE",
        "CREATE TABLE AS SELECT",
    }
)


def schema_changed(
    dt: DeltaTable, where: str, problems: list[str], since: int | None = None
) -> SchemaChanged:
    """The error for columns the sink writes that were removed or retyped, naming the newest
    commit (after version ``since``) of another writer that may have done it."""
    latest = dt.version()
    depth = latest - since if since is not None else min(latest + 1, 1000)
    culprit = f"version {latest}"
    for commit in dt.history(max(1, depth)):
        if commit.get(WRITER_KEY) != WRITER and commit.get("operation") in SCHEMA_OPERATIONS:
            culprit = f"version {commit['version']} ({commit['operation']})"
            break
    return SchemaChanged(
        f"{where}: {culprit} left a schema the sink cannot append to: {'; '.join(problems)}. "
        "Put the column back (or RESTORE the table to a version before that change, not before "
        "the sink's last batch) and run again"
    )


def _refuse_non_delta(root: Store, kind: TableKind) -> None:
    entries = root.list(root.root)
    # Names starting with "_" or "." are invisible to Delta (pidfence's own _pidfence/, _state/,
    # a nested _rejects table); anything else would become an orphan that VACUUM deletes.
    visible = [e for e in entries if not e.startswith(("_", "."))]
    if visible:
        raise NotPidfenceTable(
            f"{root.uri} is not empty and not a Delta table ({', '.join(visible[:5])}); "
            f"refusing to create the pidfence {kind} table over other files"
        )


def open_table(
    path: str,
    kind: TableKind,
    *,
    create: bool = True,
    reading: bool = False,
) -> DeltaTable:
    """The pidfence Delta table of ``kind`` at ``path``, created when absent (if ``create``).

    Args:
        reading: open it to read: tables with changed columns open too (the readers conform
            what they read).

    Raises:
        NotPidfenceTable: the path holds another Delta table (other writer, the other kind, a
            format this version does not know) or other files. Nothing is written then.
        SchemaChanged: a column the sink writes was removed or retyped (not when reading).
        TableNotFoundError: no table there and ``create`` is False.
    """
    root = Store.at(path)
    try:
        dt = DeltaTable(root.uri)
    except TableNotFoundError:
        if not create:
            raise
        _refuse_non_delta(root, kind)
        try:
            dt = DeltaTable.create(
                root.uri,
                schema_of(kind),
                mode="error",
                name=f"pidfence_{kind}",
                configuration={
                    TABLE_KEY: kind,
                    FORMAT_KEY: FORMAT_VERSION,
                    "delta.logRetentionDuration": LOG_RETENTION,
                },
                commit_properties=marker(),
                raise_if_key_not_exists=False,
            )
        except Exception as exc:  # noqa: BLE001 - a concurrent creator won: open theirs
            try:
                dt = DeltaTable(root.uri)
            except TableNotFoundError:
                raise exc from None
    if reading:
        check_marker(dt, kind, root.uri)
    else:
        check_table(dt, kind, root.uri)
    return dt


def check_path(path: str, kind: TableKind) -> bool:
    """Whether ``path`` holds a pidfence table of ``kind`` (True) or may get one (False).

    Writes nothing. Raises :class:`NotPidfenceTable` like :func:`open_table` would, so a caller
    can check every table of a sink before creating any of them.
    """
    root = Store.at(path)
    try:
        dt = DeltaTable(root.uri)
    except TableNotFoundError:
        _refuse_non_delta(root, kind)
        return False
    check_table(dt, kind, root.uri)
    return True


def check_tables(log: Store, rejects: Store, committed: Callable[[], bool]) -> None:
    """Refuse, writing nothing, what a sink cannot write at its two tables: a non-pidfence table
    at either (:func:`check_path`), or a table missing although ``committed()`` says batches
    were committed to it (creating an empty one would hide the loss).

    Raises:
        NotPidfenceTable: another writer's Delta table, the other kind, or stray files.
        SchemaChanged: a column the sink writes was removed or retyped.
        TableGone: a table is missing and ``committed()`` is true.
    """
    found = [check_path(log.uri, "log"), check_path(rejects.uri, "rejects")]
    if not all(found) and committed():
        missing = log.uri if not found[0] else rejects.uri
        raise TableGone(
            f"{missing}: the sink committed batches to a Delta table here, and it is gone "
            "(deleted, or its _delta_log removed). Restore it from a backup, or start a new "
            "--output with a new --checkpoint"
        )


_CACHE: dict[tuple[str, str], DeltaTable] = {}
_CACHE_LOCK = threading.Lock()


def cached_table(
    path: str,
    kind: TableKind,
    *,
    create: bool = True,
) -> DeltaTable:
    """:func:`open_table`, kept per process and brought up to date incrementally.

    Loading a Delta table replays its log from the last checkpoint (tens of ms after a few
    dozen commits); bringing a loaded one up to date reads only the new commits. Spark reuses its
    Python workers, so each executor and the driver pay the full load once per table.
    """
    key = (Store.at(path).uri, kind)
    with _CACHE_LOCK:
        dt = _CACHE.get(key)
    if dt is not None:
        try:
            dt.update_incremental()
        except Exception:  # noqa: BLE001 - the table was replaced or removed: load it afresh
            dt = None
        else:
            # Columns are checked where they matter (a commit: history.check_shared).
            check_marker(dt, kind, key[0])
            return dt
    dt = open_table(path, kind, create=create)
    with _CACHE_LOCK:
        _CACHE[key] = dt
    return dt


def holds_delta(path: str) -> bool:
    """Whether ``path`` holds a Delta table."""
    return bool(DeltaTable.is_deltatable(Store.at(path).uri))
