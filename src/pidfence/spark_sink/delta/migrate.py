"""``pidfence sink migrate``: a Delta output of table format 1 to today's format 2.

Format 1 named the Kafka offset ``kafka_offset``, kept neither ``timestampType`` nor the
records' ``headers``, kept the raw ``pf`` header and the committing ``batch`` in the rejects
table, and rebuilt producer state from the tables' rows. Format 2 has the Kafka source's columns
and keeps the sink's own account of each batch (its decisions files). Run with the sink stopped;
every step can be run again after a crash:

1. for every committed batch part without one, write its decisions file from the format-1 rows
   (log rows by their ``log_offset`` range, rejects by ``batch``) and name it in the manifest;
2. rewrite the rejects table, then the log table, in the new schema (``offset``; null
   ``timestampType`` and ``headers``: format 1 did not keep them), one overwrite commit each
   (the tables' transaction ids, hence exactly-once, carry over);
3. set ``pidfence.format = 2`` on both.

Readers of older table versions (time travel) see the old schema there; a downstream streaming
reader of the table must restart after the overwrite, as after any overwrite.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from pidfence.spark_sink.decisions import decided_rows
from pidfence.spark_sink.delta.errors import NotPidfenceTable
from pidfence.spark_sink.delta.table import (
    FORMAT_KEY,
    FORMAT_VERSION,
    MIGRATABLE_FORMATS,
    OWN_DIR,
    TABLE_KEY,
    TableKind,
    marker,
    schema_of,
)
from pidfence.spark_sink.layout import ParquetLayout
from pidfence.spark_sink.schema import OLD_OFFSET, conform
from pidfence.spark_sink.storage import batch_name, manifest_ids, manifest_path, part_name


@dataclass
class Migration:
    """What :func:`migrate_output` did.

    Attributes:
        decisions: decisions files written (one per committed batch part).
        tables: ``(kind, root, rows)`` of each table rewritten.
    """

    decisions: int = 0
    tables: list[tuple[str, str, int]] = field(default_factory=list)

    def human(self) -> str:
        """One line per step."""
        if not self.decisions and not self.tables:
            return "nothing to migrate: the output already has table format " + FORMAT_VERSION
        lines = [f"wrote {self.decisions} decisions file(s)"]
        lines += [f"{kind} {root}: {rows:,} rows rewritten" for kind, root, rows in self.tables]
        return "\n".join(lines)


def _format(dt: DeltaTable, kind: TableKind, where: str) -> str:
    config = dt.metadata().configuration
    if config.get(TABLE_KEY) != kind:
        raise NotPidfenceTable(f"{where} is not a pidfence {kind} table; nothing to migrate")
    version = str(config.get(FORMAT_KEY))
    if version != FORMAT_VERSION and version not in MIGRATABLE_FORMATS:
        raise NotPidfenceTable(f"{where} has pidfence table format {version!r}: not migratable")
    return version


def _old_rows(dt: DeltaTable) -> pa.Table:
    return dt.to_pyarrow_dataset().to_table()


def _write_decisions(path: str, rejects_path: str, log: pa.Table, rejects: pa.Table) -> int:
    """Step 1: a decisions file for every committed part without one."""
    layout = ParquetLayout(f"{path}/{OWN_DIR}", f"{rejects_path}/{OWN_DIR}")
    store = layout.store
    top = DeltaTable(path).transaction_version  # per query: batches at or below are committed
    written = 0
    for bid in manifest_ids(store):
        manifest: dict[str, Any] = json.loads(store.read_bytes(manifest_path(store, bid)))
        version = top(str(manifest.get("query", "")))
        if version is None or bid > version:
            continue  # an attempt that never committed
        changed = False
        for part in manifest["parts"]:
            files = part.setdefault("files", {})
            if files.get("decided"):
                continue
            topic, partition = str(part["topic"]), int(part["partition"])
            mine = (pc.field("topic") == topic) & (pc.field("partition") == partition)
            log_rows = log.filter(
                mine
                & (pc.field("log_offset") >= int(part["log_start"]))
                & (pc.field("log_offset") < int(part["log_end"]))
            )
            reject_rows = rejects.filter(mine & (pc.field("batch") == bid))
            decided = decided_rows(
                conform(log_rows, schema_of("log")),
                conform(reject_rows, schema_of("rejects").append(pa.field("pf", pa.binary()))),
            )
            tag = str(part.get("tag") or "migrated")
            rel = f"_decided/{batch_name(bid)}/{part_name(topic, partition)}.{tag}.parquet"
            store.write_table(store.join(rel), decided)
            files["decided"] = rel
            changed = True
            written += 1
        if changed:
            body = json.dumps(manifest, sort_keys=True, indent=1).encode()
            store.write_bytes(manifest_path(store, bid), body)
    return written


def _rewrite(root: str, kind: TableKind, rows: pa.Table) -> int:
    """Step 2: the table's rows in today's schema, in one overwrite commit."""
    table = conform(rows, schema_of(kind))
    write_deltalake(
        root,
        table,
        mode="overwrite",
        schema_mode="overwrite",
        commit_properties=marker(**{"pidfence.migrated": f"format {FORMAT_VERSION}"}),
    )
    return int(table.num_rows)


def migrate_output(path: str, rejects_path: str | None = None) -> Migration:
    """Migrate a Delta output of table format 1 (log and rejects tables) to this format.

    Args:
        path: the sink's ``path``.
        rejects_path: the sink's ``rejectsPath`` (default ``<path>/_rejects``).

    Raises:
        NotPidfenceTable: ``path`` holds no pidfence log table of a migratable format.
    """
    path = path.rstrip("/")
    rejects_path = (rejects_path or f"{path}/_rejects").rstrip("/")
    try:
        log_dt = DeltaTable(path)
    except TableNotFoundError as exc:
        raise NotPidfenceTable(f"{path} holds no Delta table; nothing to migrate") from exc
    report = Migration()
    tables: list[tuple[TableKind, str, DeltaTable]] = [("log", path, log_dt)]
    with contextlib.suppress(TableNotFoundError):
        tables.insert(0, ("rejects", rejects_path, DeltaTable(rejects_path)))
    old = [(k, r, dt) for k, r, dt in tables if _format(dt, k, r) != FORMAT_VERSION]
    if not old:
        return report
    rows = {k: _old_rows(dt) for k, _, dt in tables}
    rejects = rows.get("rejects", schema_of("rejects").empty_table())
    if OLD_OFFSET in rows["log"].column_names or "batch" in rejects.column_names:
        report.decisions = _write_decisions(path, rejects_path, rows["log"], rejects)
    for kind, root, _ in old:
        if OLD_OFFSET in rows[kind].column_names or "batch" in rows[kind].column_names:
            report.tables.append((kind, root, _rewrite(root, kind, rows[kind])))
        DeltaTable(root).alter.set_table_properties(
            {FORMAT_KEY: FORMAT_VERSION}, raise_if_not_exists=False, commit_properties=marker()
        )
    return report


__all__ = ["Migration", "migrate_output"]
